//! What went wrong in a cloud call, and what the caller should do about it.
//!
//! Every API failure is reduced to an [`ApiError`] (the provider's error code + message) and then
//! to an [`ErrorClass`]; the class alone decides retrying, so the `aws` and `memory` backends
//! behave identically towards the controllers.

use std::fmt;

/// An error as the cloud API reported it: a stable code (`RequestLimitExceeded`,
/// `InvalidAMIID.NotFound`, ...) and a human message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub code: String,
    pub message: String,
}

impl ApiError {
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

/// How a failed call should be handled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    /// The API asked us to slow down: back off with jitter and try again.
    Throttled,
    /// An instance id that EC2 does not know *yet* (it was just launched): retry for a bounded
    /// time, because EC2's read path lags its write path.
    NotFoundEventuallyConsistent,
    /// Retrying cannot help (unknown AMI, unsupported instance type, no capacity, bad
    /// configuration). Surfaced to the user as a condition carrying the message.
    Permanent(String),
    /// Probably a blip (5xx, connection reset): a few retries.
    Transient,
}

/// Error codes meaning "slow down". EC2 says `RequestLimitExceeded`; Route53 says `Throttling`
/// and, while a change to the same record is still propagating, `PriorRequestNotComplete`.
const THROTTLING_CODES: &[&str] = &[
    "RequestLimitExceeded",
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottled",
    "RequestThrottledException",
    "TooManyRequestsException",
    "PriorRequestNotComplete",
    "SlowDown",
];

/// Error codes that will not change by asking again. Capacity shortages are here on purpose: a
/// tight retry loop against `InsufficientInstanceCapacity` is exactly the storm to avoid; the
/// controller retries on its own (slow) requeue schedule instead.
const PERMANENT_CODES: &[&str] = &[
    "Unsupported",
    "UnsupportedOperation",
    "InsufficientInstanceCapacity",
    "InsufficientHostCapacity",
    "InsufficientCapacity",
    "InsufficientReservedInstanceCapacity",
    "InstanceLimitExceeded",
    "VcpuLimitExceeded",
    // A full subnet stays full until someone frees addresses or adds a subnet: asking again
    // at once cannot help, and as a transient error it would be retried in a tight loop.
    "InsufficientFreeAddressesInSubnet",
    "InvalidParameterValue",
    "InvalidParameterCombination",
    "InvalidParameter",
    "MissingParameter",
    "InvalidSubnetID.NotFound",
    "InvalidGroup.NotFound",
    "InvalidSecurityGroupID.NotFound",
    "IdempotentParameterMismatch",
    "UnauthorizedOperation",
    "AuthFailure",
    "AccessDenied",
    "AccessDeniedException",
    "InvalidClientTokenId",
    "OptInRequired",
    "Blocked",
    "InvalidInput",
    "InvalidChangeBatch",
    "NoSuchHostedZone",
];

/// Classify an API error. Unknown codes count as [`ErrorClass::Transient`]: they get a few
/// bounded retries, never an unbounded loop.
pub fn classify(error: &ApiError) -> ErrorClass {
    let code = error.code.as_str();
    if THROTTLING_CODES.contains(&code) {
        ErrorClass::Throttled
    } else if code == "InvalidInstanceID.NotFound" {
        ErrorClass::NotFoundEventuallyConsistent
    } else if code.starts_with("InvalidAMIID.")
        // moto (and some EC2 APIs) report an unknown type as InvalidInstanceType.NotFound.
        || code.starts_with("InvalidInstanceType")
        || PERMANENT_CODES.contains(&code)
    {
        ErrorClass::Permanent(error.message.clone())
    } else {
        ErrorClass::Transient
    }
}

/// The error a provider call returns once retrying is over.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CloudError {
    /// Needs a human (or at least a different request): show `message` in a condition.
    #[error("{operation} failed permanently: {code}: {message}")]
    Permanent {
        operation: String,
        code: String,
        message: String,
    },
    /// Still throttled after the retry budget; requeue later.
    #[error("{operation} is still throttled after retries: {message}")]
    Throttled { operation: String, message: String },
    /// Still failing after the retry budget with an error that may clear by itself.
    #[error("{operation} failed: {code}: {message}")]
    Transient {
        operation: String,
        code: String,
        message: String,
    },
    /// The operator's own cloud configuration cannot serve this request (no subnet for the
    /// zone, no hosted zone, a template placeholder nobody fills).
    #[error("cloud configuration: {0}")]
    Config(String),
}

impl CloudError {
    /// The retry budget is exhausted or irrelevant: build the final error for `operation`.
    pub fn from_api(operation: &str, error: ApiError) -> Self {
        match classify(&error) {
            ErrorClass::Throttled => CloudError::Throttled {
                operation: operation.to_string(),
                message: error.message,
            },
            ErrorClass::Permanent(message) => CloudError::Permanent {
                operation: operation.to_string(),
                code: error.code,
                message,
            },
            ErrorClass::NotFoundEventuallyConsistent | ErrorClass::Transient => {
                CloudError::Transient {
                    operation: operation.to_string(),
                    code: error.code,
                    message: error.message,
                }
            }
        }
    }

    /// True when retrying the same request cannot succeed.
    pub fn is_permanent(&self) -> bool {
        matches!(self, CloudError::Permanent { .. } | CloudError::Config(_))
    }

    /// The provider's error code, if the error came from the provider.
    pub fn code(&self) -> Option<&str> {
        match self {
            CloudError::Permanent { code, .. } | CloudError::Transient { code, .. } => Some(code),
            CloudError::Throttled { .. } => Some("Throttled"),
            CloudError::Config(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(code: &str) -> ErrorClass {
        classify(&ApiError::new(code, "msg"))
    }

    #[test]
    fn throttling_codes_of_ec2_and_route53_back_off() {
        assert_eq!(class("RequestLimitExceeded"), ErrorClass::Throttled);
        assert_eq!(class("Throttling"), ErrorClass::Throttled);
        assert_eq!(class("PriorRequestNotComplete"), ErrorClass::Throttled);
    }

    #[test]
    fn unknown_instance_id_is_eventual_consistency() {
        assert_eq!(
            class("InvalidInstanceID.NotFound"),
            ErrorClass::NotFoundEventuallyConsistent
        );
    }

    #[test]
    fn bad_ami_type_and_capacity_are_permanent_with_the_aws_message() {
        for code in [
            "InvalidAMIID.NotFound",
            "InvalidAMIID.Malformed",
            "InvalidParameterValue",
            "Unsupported",
            "InsufficientInstanceCapacity",
            "InvalidInstanceType.NotFound",
            "InsufficientFreeAddressesInSubnet",
        ] {
            let e = ApiError::new(code, format!("the {code} message"));
            assert_eq!(
                classify(&e),
                ErrorClass::Permanent(format!("the {code} message")),
                "{code}"
            );
        }
    }

    #[test]
    fn server_errors_and_unknown_codes_are_transient() {
        assert_eq!(class("InternalError"), ErrorClass::Transient);
        assert_eq!(class("ServiceUnavailable"), ErrorClass::Transient);
        assert_eq!(class("Dispatch"), ErrorClass::Transient);
    }

    #[test]
    fn final_errors_keep_code_and_message() {
        let e = CloudError::from_api(
            "RunInstances",
            ApiError::new(
                "InvalidAMIID.NotFound",
                "The image id '[ami-1]' does not exist",
            ),
        );
        assert!(e.is_permanent());
        assert_eq!(e.code(), Some("InvalidAMIID.NotFound"));
        assert!(e.to_string().contains("ami-1"));
        let t = CloudError::from_api("DescribeInstances", ApiError::new("Throttling", "slow"));
        assert!(!t.is_permanent());
    }
}

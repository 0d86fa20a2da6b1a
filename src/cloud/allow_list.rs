//! What a tenant may launch. `spec.node.image` and `spec.node.instanceType` are the tenant's to
//! write, and every dedicated node boots in the cluster's subnet with the node instance profile
//! and the cluster's join configuration: an image the tenant built would be root on a cluster
//! node with the node role's credentials, and an instance type is a cost. The operator's flags
//! name what may be launched; every RunInstances is checked against them first.

use super::ImageFacts;

/// The operator's launch allow-list (`--allowed-node-images`, `--allowed-node-image-owners`,
/// `--allowed-node-instance-types`). An empty list allows anything of its kind.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LaunchAllowList {
    /// AMI ids that may be launched.
    pub images: Vec<String>,
    /// Whose images may be launched: AWS account ids (DescribeImages' `OwnerId`, e.g. the
    /// account that publishes the EKS-optimised AMIs, or your own image pipeline's) or an
    /// owner alias (`ImageOwnerAlias`: `amazon`), as IAM's `ec2:Owner` condition takes them,
    /// so one list serves both.
    pub image_owners: Vec<String>,
    /// Instance types, exact (`m6i.large`) or with one trailing `*` (`m6i.*`, `r7g.*`).
    pub instance_types: Vec<String>,
}

/// What the image check needs to know before it can answer.
#[derive(Debug, PartialEq, Eq)]
pub enum ImageVerdict {
    Allowed,
    /// Listed owners exist and the id is not listed: DescribeImages must say whose it is.
    AskOwner,
    Refused(String),
}

impl LaunchAllowList {
    pub(crate) fn is_empty(&self) -> bool {
        self.images.is_empty() && self.image_owners.is_empty() && self.instance_types.is_empty()
    }

    /// `None` when `instance_type` may be launched, else the refusal naming the rule.
    pub fn refuse_instance_type(&self, instance_type: &str) -> Option<String> {
        if self.instance_types.is_empty()
            || self
                .instance_types
                .iter()
                .any(|pattern| type_matches(pattern, instance_type))
        {
            return None;
        }
        Some(format!(
            "instance type {instance_type} is not allowed by --allowed-node-instance-types ({})",
            self.instance_types.join(", ")
        ))
    }

    /// The image check from the id alone.
    pub(crate) fn image(&self, image: &str) -> ImageVerdict {
        if self.images.is_empty() && self.image_owners.is_empty() {
            return ImageVerdict::Allowed;
        }
        if self.images.iter().any(|i| i == image) {
            return ImageVerdict::Allowed;
        }
        if self.image_owners.is_empty() {
            return ImageVerdict::Refused(format!(
                "image {image} is not allowed by --allowed-node-images ({})",
                self.images.join(", ")
            ));
        }
        ImageVerdict::AskOwner
    }

    /// The image check once DescribeImages answered (`None`: EC2 does not know the image).
    pub(crate) fn image_owned(&self, image: &str, facts: Option<&ImageFacts>) -> Option<String> {
        match facts {
            Some(f)
                if self
                    .image_owners
                    .iter()
                    .any(|o| o == &f.owner || f.owner_alias.as_ref() == Some(o)) =>
            {
                None
            }
            Some(f) => Some(format!(
                "image {image} belongs to account {}, which --allowed-node-image-owners ({}) does not name{}",
                if f.owner.is_empty() { "unknown" } else { &f.owner },
                self.image_owners.join(", "),
                self.listed_images_note()
            )),
            None => Some(format!(
                "image {image} is unknown to EC2, so its owner cannot be checked against --allowed-node-image-owners"
            )),
        }
    }

    fn listed_images_note(&self) -> String {
        if self.images.is_empty() {
            String::new()
        } else {
            ", and --allowed-node-images does not list it".to_string()
        }
    }
}

fn type_matches(pattern: &str, instance_type: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => instance_type.starts_with(prefix),
        None => pattern == instance_type,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(owner: &str) -> ImageFacts {
        ImageFacts {
            id: "ami-1".into(),
            state: "available".into(),
            architecture: "x86_64".into(),
            root_device_type: "ebs".into(),
            root_device_name: Some("/dev/xvda".into()),
            ebs_devices: Vec::new(),
            owner: owner.into(),
            owner_alias: None,
        }
    }

    #[test]
    fn without_a_list_anything_may_be_launched() {
        let none = LaunchAllowList::default();
        assert_eq!(none.image("ami-anything"), ImageVerdict::Allowed);
        assert_eq!(none.refuse_instance_type("u-24tb1.metal"), None);
    }

    #[test]
    fn instance_types_match_exactly_or_by_family() {
        let list = LaunchAllowList {
            instance_types: vec!["m6i.*".into(), "r7g.2xlarge".into()],
            ..Default::default()
        };
        assert_eq!(list.refuse_instance_type("m6i.large"), None);
        assert_eq!(list.refuse_instance_type("r7g.2xlarge"), None);
        let refused = list.refuse_instance_type("r7g.16xlarge").expect("refused");
        assert!(
            refused.contains("--allowed-node-instance-types"),
            "{refused}"
        );
        assert!(
            list.refuse_instance_type("m6id.large").is_some(),
            "m6i.* is the m6i family only"
        );
    }

    #[test]
    fn a_listed_image_passes_and_any_other_is_refused_or_asked_about() {
        let ids = LaunchAllowList {
            images: vec!["ami-good".into()],
            ..Default::default()
        };
        assert_eq!(ids.image("ami-good"), ImageVerdict::Allowed);
        assert!(
            matches!(ids.image("ami-evil"), ImageVerdict::Refused(m) if m.contains("--allowed-node-images"))
        );
        let owners = LaunchAllowList {
            images: vec!["ami-good".into()],
            image_owners: vec!["602401143452".into()],
            ..Default::default()
        };
        assert_eq!(owners.image("ami-good"), ImageVerdict::Allowed);
        assert_eq!(owners.image("ami-eks"), ImageVerdict::AskOwner);
        assert_eq!(
            owners.image_owned("ami-eks", Some(&facts("602401143452"))),
            None
        );
        // The alias IAM's `ec2:Owner` takes for Amazon's images is an owner here too.
        let amazon = LaunchAllowList {
            image_owners: vec!["amazon".into()],
            ..Default::default()
        };
        let aliased = ImageFacts {
            owner_alias: Some("amazon".into()),
            ..facts("137112412989")
        };
        assert_eq!(amazon.image_owned("ami-al2023", Some(&aliased)), None);
        assert!(amazon
            .image_owned("ami-lookalike", Some(&facts("137112412989")))
            .is_some());
        let refused = owners
            .image_owned("ami-built-by-a-tenant", Some(&facts("111122223333")))
            .expect("refused");
        assert!(
            refused.contains("111122223333") && refused.contains("--allowed-node-image-owners"),
            "{refused}"
        );
        assert!(owners.image_owned("ami-gone", None).is_some());
    }
}

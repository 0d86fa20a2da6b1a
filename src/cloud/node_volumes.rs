//! The EBS volumes a dedicated node boots with: every EBS device its image maps, each
//! encrypted gp3 and deleted with the instance (the database's data has its own volume,
//! never one of these).

use super::ImageFacts;

/// The root device of the EKS-optimized AL2023 and Bottlerocket images.
pub(crate) const DEFAULT_ROOT_DEVICE: &str = "/dev/xvda";

/// The operator's settings for a dedicated node's own volumes (`--node-root-*`,
/// `--node-data-volume-gib`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeVolumes {
    /// Where the root volume is mapped. Empty: the image's `RootDeviceName` (DescribeImages at
    /// launch), so an image whose root is elsewhere does not boot from an unencrypted
    /// default-size volume beside an unused one.
    pub root_device_name: String,
    /// At least this size; more when the image's root snapshot is larger (EC2 refuses a
    /// volume smaller than its snapshot).
    pub root_size_gib: i32,
    /// Size of every other EBS device of the image (Bottlerocket's `/dev/xvdb`, which holds
    /// container images and pod ephemeral storage). `None`: the image's own size.
    pub data_size_gib: Option<i32>,
    /// KMS key of every volume's encryption; the account's default EBS key when unset.
    pub kms_key_id: Option<String>,
}

impl Default for NodeVolumes {
    fn default() -> Self {
        Self {
            root_device_name: String::new(),
            root_size_gib: 20,
            data_size_gib: None,
            kms_key_id: None,
        }
    }
}

/// One EBS device of a RunInstances request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockDevice {
    pub device_name: String,
    /// `None`: the size of the image's snapshot.
    pub size_gib: Option<i32>,
}

/// The devices a launch maps, root first: the root at the configured device or the image's,
/// sized up to the image's snapshot; then every other EBS device of the image, so none of them
/// boots with the image's unencrypted default. `image` is `None` when EC2 does not describe the
/// image (RunInstances then names the real problem).
pub(crate) fn block_devices(volumes: &NodeVolumes, image: Option<&ImageFacts>) -> Vec<BlockDevice> {
    let image_root = image
        .and_then(|i| i.root_device_name.as_deref())
        .filter(|d| !d.is_empty());
    let root = match volumes.root_device_name.trim() {
        "" => image_root.unwrap_or(DEFAULT_ROOT_DEVICE),
        configured => configured,
    };
    let devices = image.map(|i| i.ebs_devices.as_slice()).unwrap_or_default();
    let snapshot_size = |name: &str| {
        devices
            .iter()
            .find(|d| d.device_name == name)
            .and_then(|d| d.size_gib)
    };
    let at_least = |wanted: Option<i32>, snapshot: Option<i32>| match (wanted, snapshot) {
        (Some(w), Some(s)) => Some(w.max(s)),
        (w, s) => w.or(s),
    };
    let mut out = vec![BlockDevice {
        device_name: root.to_string(),
        size_gib: at_least(Some(volumes.root_size_gib), snapshot_size(root)),
    }];
    out.extend(
        devices
            .iter()
            .filter(|d| d.device_name != root)
            .map(|d| BlockDevice {
                device_name: d.device_name.clone(),
                // The image's own root, when the operator maps the root elsewhere, still boots
                // the node: encrypted, at its own size, never sized as a data volume.
                size_gib: if Some(d.device_name.as_str()) == image_root {
                    d.size_gib
                } else {
                    at_least(volumes.data_size_gib, d.size_gib)
                },
            }),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::ImageDevice;

    fn image(root: &str, devices: &[(&str, Option<i32>)]) -> ImageFacts {
        ImageFacts {
            id: "ami-1".into(),
            state: "available".into(),
            architecture: "x86_64".into(),
            root_device_type: "ebs".into(),
            root_device_name: Some(root.into()),
            ebs_devices: devices
                .iter()
                .map(|(name, size)| ImageDevice {
                    device_name: name.to_string(),
                    size_gib: *size,
                })
                .collect(),
            owner: "602401143452".into(),
            owner_alias: None,
        }
    }

    fn device(name: &str, size: Option<i32>) -> BlockDevice {
        BlockDevice {
            device_name: name.into(),
            size_gib: size,
        }
    }

    #[test]
    fn a_bottlerocket_data_volume_is_mapped_encrypted_and_sized_not_left_to_the_image() {
        let bottlerocket = image(
            "/dev/xvda",
            &[("/dev/xvda", Some(2)), ("/dev/xvdb", Some(20))],
        );
        let mut volumes = NodeVolumes::default();
        assert_eq!(
            block_devices(&volumes, Some(&bottlerocket)),
            [device("/dev/xvda", Some(20)), device("/dev/xvdb", Some(20))]
        );
        volumes.data_size_gib = Some(100);
        assert_eq!(
            block_devices(&volumes, Some(&bottlerocket))[1],
            device("/dev/xvdb", Some(100))
        );
    }

    #[test]
    fn no_volume_is_asked_smaller_than_its_snapshot_which_ec2_would_refuse() {
        let big_root = image(
            "/dev/sda1",
            &[("/dev/sda1", Some(50)), ("/dev/sdb", Some(30))],
        );
        let volumes = NodeVolumes {
            root_size_gib: 20,
            data_size_gib: Some(10),
            ..NodeVolumes::default()
        };
        assert_eq!(
            block_devices(&volumes, Some(&big_root)),
            [device("/dev/sda1", Some(50)), device("/dev/sdb", Some(30))]
        );
    }

    #[test]
    fn the_root_goes_where_the_image_has_it_unless_the_operator_says_otherwise() {
        let al2023 = image("/dev/xvda", &[("/dev/xvda", Some(4))]);
        let volumes = NodeVolumes::default();
        assert_eq!(
            block_devices(&volumes, Some(&al2023)),
            [device("/dev/xvda", Some(20))]
        );
        let configured = NodeVolumes {
            root_device_name: "/dev/sda1".into(),
            ..NodeVolumes::default()
        };
        // The image's own root is still mapped encrypted: no volume keeps the image's default.
        assert_eq!(
            block_devices(&configured, Some(&al2023)),
            [device("/dev/sda1", Some(20)), device("/dev/xvda", Some(4))]
        );
        // An image EC2 does not describe: the AL2023 default, the configured size.
        assert_eq!(
            block_devices(&volumes, None),
            [device(DEFAULT_ROOT_DEVICE, Some(20))]
        );
    }
}

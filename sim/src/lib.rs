//! A simulated Kubernetes control plane: an apiserver speaking the real REST + watch protocol on
//! 127.0.0.1, plus simulated cluster behaviour (scheduler, kubelets, StatefulSets, volumes).

pub mod clock;
pub mod cluster;

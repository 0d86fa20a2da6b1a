//! Code shared by the benchmarks that run the real operator binary as a child process against
//! the real control plane: the child process, its memory, its metrics, waiting.
//!
//! Each bench compiles its own copy of this module and uses only part of it, hence the
//! `dead_code` allowance (an unused helper in one bench is used by another).
#![allow(dead_code)]

pub mod args;
pub mod cluster;
pub mod control_plane;
pub mod http;
pub mod operator;
pub mod pod;
pub mod prom;
pub mod wait;

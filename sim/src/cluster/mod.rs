//! Simulated cluster behaviour (in progress).

//! Keeps the operator's resident memory near its live heap. glibc's malloc keeps what a burst
//! freed (a full resync's pages of lists, the JSON of a thousand watch events) in its arenas,
//! one per thread that ever allocated, up to eight per core: the process then stays at its
//! peak although the caches it keeps are far smaller. Two arenas and a trim every ten seconds
//! (the caches' first lists are the heap's peak) return that memory; `malloc_trim` gives back
//! whole free pages anywhere in the heap (glibc 2.8 and later), not only its top.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// How often freed memory is handed back while the operator runs.
pub const TRIM_EVERY: Duration = Duration::from_secs(10);

/// At most two malloc arenas. Called before the async runtime starts its threads (an arena
/// is made for a thread when it first allocates under contention).
pub(crate) fn limit_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets a malloc tunable; it is called before any thread but main
    // exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// Hands every whole free page of the heap back to the OS.
pub(crate) fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes the arenas' locks itself; it frees nothing in use.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Trims at once and then every [`TRIM_EVERY`] until `stop`, off the async workers (a trim
/// walks the heap: a few milliseconds at a thousand databases).
pub(crate) async fn trim_until(stop: CancellationToken) {
    let mut tick = tokio::time::interval(TRIM_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {
                let _ = tokio::task::spawn_blocking(trim).await;
            }
        }
    }
}

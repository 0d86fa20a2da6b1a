//! Pure planners: a QuestDB and what was observed in, the next step out. No client, no clock
//! read, no cache: every decision is a unit test, and this crate has no client or runtime to
//! reach for; the operator's `controllers/` carry the steps out.
//!
//! - [`node`]: the dedicated node (launch, pin, release);
//! - [`cloud`]: which cloud machine acts in a reconcile (failover, node move), and in what role;
//! - [`dns`]: the Route53 record that follows it;
//! - [`failover`]: when a silent node is fenced and replaced, and the breaker that holds back;
//! - [`node_move`]: the node move (a new image or instance type, and its rollback);
//! - [`maintenance`]: the windows a move waits for;
//! - [`config_reload`]: settings reloaded into the running database, or restarted for;
//! - [`version_upgrade`]: a change of QuestDB version, with a snapshot and a way back;
//! - [`disk`]: a volume grown before it fills, the tables a full one suspended resumed;
//! - [`backup`]: a backup's steps (checkpoint, snapshot, release, the restore that proves it),
//!   the queue of backups of one database, and who holds its checkpoint;
//! - [`schedule`] and [`cron`]: a backup schedule's runs and retention;
//! - [`conditions`]: status conditions as verdicts, merged with their transition times kept.

pub mod backup;
pub mod cloud;
pub mod conditions;
pub mod config_reload;
pub mod cron;
pub mod disk;
pub mod dns;
pub mod failover;
pub mod maintenance;
pub mod node;
pub mod node_move;
pub mod operator_rollout;
pub mod preflight;
pub mod schedule;
pub mod version_upgrade;

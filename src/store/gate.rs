//! A statement's commit gate: the one point where a write stops being abandonable.
//!
//! A caller that stops waiting for a write (a statement timeout, a cancel request) must not
//! tell its client the write did not happen while the store goes on to commit it, and must
//! not wait forever either. So the caller (the wire server, around each statement) runs the
//! statement inside a gate, and every store write passes it just before its commit: the
//! first of the two to act wins. A caller that abandons first gets `true` from
//! [`CommitGate::abandon`], reports the timeout, and the write rolls back when it reaches
//! the gate; a write that reaches the gate first is committed, and the caller, getting
//! `false`, waits for the statement's real outcome instead, as PostgreSQL does not cancel a
//! commit in progress. Outside a gate (the archiver, the embedded API) writes commit as
//! before.

use std::future::Future;
use std::sync::{Arc, Mutex};

/// Where a statement stands; see the module comment.
#[derive(Debug, Default)]
pub struct CommitGate(Mutex<Stage>);

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Stage {
    #[default]
    Open,
    Committing,
    Abandoned,
}

impl CommitGate {
    /// A gate for one statement.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// The writer's side, just before a commit: `true` when it may go ahead (from then on
    /// the statement cannot be abandoned), `false` when the caller has abandoned it (roll
    /// back).
    pub fn begin_commit(&self) -> bool {
        let mut stage = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match *stage {
            Stage::Abandoned => false,
            _ => {
                *stage = Stage::Committing;
                true
            }
        }
    }

    /// The caller's side: `true` when the statement is abandoned now (no commit has begun,
    /// and none will), `false` when a commit has begun (wait for the outcome).
    pub fn abandon(&self) -> bool {
        let mut stage = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match *stage {
            Stage::Committing => false,
            _ => {
                *stage = Stage::Abandoned;
                true
            }
        }
    }
}

tokio::task_local! {
    static STATEMENT: Arc<CommitGate>;
}

/// Runs `work` with `gate` as the gate of the store writes it makes on this task.
pub async fn within<F: Future>(gate: Arc<CommitGate>, work: F) -> F::Output {
    STATEMENT.scope(gate, work).await
}

/// The gate of the statement running on this task, if any.
pub fn current() -> Option<Arc<CommitGate>> {
    STATEMENT.try_with(Arc::clone).ok()
}

/// The writer's check outside the gate's task (a blocking store call): `true` when the
/// commit may go ahead.
pub fn may_commit(gate: Option<&CommitGate>) -> bool {
    gate.is_none_or(CommitGate::begin_commit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_to_act_wins() {
        let g = CommitGate::new();
        assert!(g.begin_commit());
        assert!(!g.abandon(), "a commit in progress is not abandoned");
        assert!(
            g.begin_commit(),
            "a second write of the same statement commits too"
        );
        let g = CommitGate::new();
        assert!(g.abandon());
        assert!(!g.begin_commit(), "an abandoned statement commits nothing");
        assert!(g.abandon());
        assert!(may_commit(None));
    }

    #[tokio::test]
    async fn the_gate_is_seen_only_inside_its_statement() {
        assert!(current().is_none());
        let g = CommitGate::new();
        let seen = within(g.clone(), async { current() }).await.unwrap();
        assert!(Arc::ptr_eq(&seen, &g));
        assert!(current().is_none());
    }
}

//! `EXPLAIN` of a coordinator shows the plan that runs: its stages, their tasks and where
//! each scan's buckets went.
//!
//! datafusion-distributed turns a physical plan into stages after DataFusion has planned
//! it, and DataFusion renders `EXPLAIN` inside its own planner, before that step: without
//! this wrapper, `EXPLAIN` would show the single-process plan. The wrapper plans the
//! explained statement once more through the distributed planner and puts that drawing in
//! the `physical_plan` row. (`EXPLAIN ANALYZE` is datafusion-distributed's own and already
//! reports per-task metrics.)

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::common::display::{PlanType, StringifiedPlan};
use datafusion::error::Result as DFResult;
use datafusion::execution::context::QueryPlanner;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::explain::ExplainExec;
use datafusion::physical_plan::ExecutionPlan;
use datafusion_distributed::{display_plan_ascii, DistributedExec};

/// The session's query planner, with `EXPLAIN` showing distributed plans.
#[derive(Debug)]
pub(crate) struct ExplainStages {
    pub(crate) inner: Arc<dyn QueryPlanner + Send + Sync>,
}

#[async_trait]
impl QueryPlanner for ExplainStages {
    async fn create_physical_plan(
        &self,
        logical: &LogicalPlan,
        session: &dyn Session,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let plan = self.inner.create_physical_plan(logical, session).await?;
        let (LogicalPlan::Explain(explain), Some(exec)) =
            (logical, plan.downcast_ref::<ExplainExec>())
        else {
            return Ok(plan);
        };
        let explained = self
            .inner
            .create_physical_plan(&explain.plan, session)
            .await?;
        if !explained.is::<DistributedExec>() {
            return Ok(plan);
        }
        let drawing = display_plan_ascii(explained.as_ref(), false);
        let plans = exec
            .stringified_plans()
            .iter()
            .map(|p| match p.plan_type {
                PlanType::FinalPhysicalPlan => {
                    StringifiedPlan::new(PlanType::FinalPhysicalPlan, drawing.clone())
                }
                _ => p.clone(),
            })
            .collect();
        Ok(Arc::new(ExplainExec::new(
            exec.schema(),
            plans,
            exec.verbose(),
        )))
    }
}

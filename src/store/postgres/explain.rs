//! The plans of the store's per-cycle registry reads, for tests that hold them to their
//! indexes at scale (docs/registry-scale.md): each statement is planned exactly as the
//! store sends it, and as its sessions plan it (a generic plan, by `PREPARE` and `EXPLAIN
//! EXECUTE`, which no parameter value changes). PostgreSQL only: `plan_cache_mode` and these
//! plans' index names are its own.

use super::changes::expired_sql;
use super::lifecycle::{archiving_sql, backlog_sql, discover_sql, routed_among_sql};
use super::sql::{micros, Params};
use super::PgStore;
use crate::model::TableId;
use crate::store::{BucketFilter, Eligibility, StoreResult};

impl PgStore {
    /// `EXPLAIN` of discovery, the backlog, the in-flight claims, GC's route check,
    /// retention's expired buckets of `table_id` (bound: the rule's cutoff) and a listing of
    /// `table_id` by `filter`, by statement name, each plan as text.
    #[doc(hidden)]
    pub async fn explain_registry_reads(
        &self,
        table_id: &TableId,
        rule: &Eligibility,
        filter: &BucketFilter,
    ) -> StoreResult<Vec<(&'static str, String)>> {
        let (cutoff, bound) = (rule.cutoff.to_datetime(), rule.policy_bound().to_datetime());
        let limit = 100i64;
        let keys = vec!["no/such/manifest.json".to_string()];
        let (list_sql, list_params) = self.list_statement(table_id, filter);
        let expired: Params = vec![
            Box::new(table_id.as_str().to_string()),
            Box::new(cutoff),
            Box::new(limit),
        ];
        let statements: Vec<(&'static str, String, Params)> = vec![
            (
                "discover",
                discover_sql(),
                vec![
                    Box::new(cutoff),
                    Box::new(bound),
                    Box::new(micros(std::time::Duration::ZERO)),
                    Box::new(limit),
                ],
            ),
            (
                "backlog",
                backlog_sql(),
                vec![Box::new(cutoff), Box::new(bound)],
            ),
            ("archiving_claims", archiving_sql(), Vec::new()),
            ("routed_among", routed_among_sql(), vec![Box::new(keys)]),
            ("expired_buckets", expired_sql(), expired),
            ("list_buckets", list_sql, list_params),
        ];
        let mut out = Vec::new();
        for (name, sql, params) in statements {
            // The generic plan, as the store's sessions run them (`force_generic_plan`,
            // see the module comment of `postgres`): `EXPLAIN` of the statement with bound
            // parameters would plan it for those values instead. A generic plan depends on
            // no value, and `EXECUTE` takes no protocol parameters, so it runs with NULLs.
            let nulls = vec!["NULL"; params.len()].join(", ");
            let execute = if params.is_empty() {
                "EXPLAIN EXECUTE pulpitum_explain".to_string()
            } else {
                format!("EXPLAIN EXECUTE pulpitum_explain({nulls})")
            };
            let plan = self
                .run("explain", || async {
                    let client = self.pooled().await?;
                    // The session's own setting is put back, and the statement
                    // deallocated, whatever the plan's outcome.
                    let mode: String = client
                        .query_one("SELECT current_setting('plan_cache_mode')", &[])
                        .await?
                        .get(0);
                    client
                        .query_one(
                            "SELECT set_config('plan_cache_mode', 'force_generic_plan', false)",
                            &[],
                        )
                        .await?;
                    let prepared = client
                        .batch_execute(&format!("PREPARE pulpitum_explain AS {sql}"))
                        .await;
                    let rows = match prepared {
                        Ok(()) => {
                            let rows = client.query(&execute, &[]).await;
                            client.batch_execute("DEALLOCATE pulpitum_explain").await?;
                            rows
                        }
                        Err(e) => Err(e),
                    };
                    client
                        .query_one("SELECT set_config('plan_cache_mode', $1, false)", &[&mode])
                        .await?;
                    Ok(rows?
                        .iter()
                        .map(|r| r.try_get::<_, String>(0))
                        .collect::<Result<Vec<_>, _>>()?
                        .join("\n"))
                })
                .await?;
            out.push((name, plan));
        }
        Ok(out)
    }
}

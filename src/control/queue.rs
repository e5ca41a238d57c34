//! The tiering queue: the rule that says whether a bucket is archive work now and why (the
//! `eligible` and `reason` columns of `pulpitum_buckets`), and the queue view the shell's
//! `\buckets` prints.
//!
//! A reason's "eligible from" time is computed from the bucket's end and the rule that holds
//! it, never from the clock of the query, so it is the same in every query until the rule
//! changes: `archive_after` holds a bucket until its end plus that duration; the default
//! cutoff (January 1 of the previous UTC year) until the first January 1 of a year after the
//! one that starts at or after its end ([`default_cutoff_reaches`]).

use std::time::Duration;

use datafusion::arrow::array::{Array, Int64Array};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::prelude::{col, lit, DataFrame, SessionContext};

use super::options::{format_duration, format_retention};
use crate::archiver::config::default_cutoff_reaches;
use crate::model::EventTime;
use crate::store::{BucketMeta, BucketState, TablePolicy};

/// Whether a bucket is archive work now, and why (not), by the registry's rules.
pub(super) struct Judge<'a> {
    pub now: EventTime,
    pub policy: Option<&'a TablePolicy>,
    pub store_paused: bool,
}

fn minus(t: EventTime, d: Duration) -> i64 {
    t.as_micros()
        .saturating_sub(i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

fn plus(t: EventTime, d: Duration) -> Option<EventTime> {
    let d = i64::try_from(d.as_micros()).ok()?;
    EventTime::from_micros(t.as_micros().checked_add(d)?).ok()
}

impl Judge<'_> {
    pub fn judge(&self, m: &BucketMeta) -> (bool, String) {
        let now = self.now.as_micros();
        let lease_live = m.lease_expires_at.is_some_and(|t| t.as_micros() > now);
        let paused = if self.store_paused {
            Some("paused: the whole store (SYSTEM START MOVES resumes)")
        } else if self.policy.is_some_and(|p| p.paused) {
            Some("paused: this table (SYSTEM START MOVES <table> resumes)")
        } else {
            None
        };
        // Past retention: whatever its state, the archiver's next cycle removes it (an
        // Archiving bucket once it is published).
        if let Some(keep) = self.policy.and_then(|p| p.retain_for) {
            if m.id.bucket_key.end().as_micros() <= minus(self.now, keep) {
                return (
                    false,
                    format!(
                        "past retention (retain_for {}): removed by the archiver's next cycle",
                        format_retention(keep)
                    ),
                );
            }
        }
        match &m.state {
            BucketState::Archived { hot_deleted, .. } => (
                false,
                if *hot_deleted {
                    "archived".into()
                } else {
                    "archived; hot rows await cleanup".into()
                },
            ),
            BucketState::Archiving if lease_live => (
                false,
                format!(
                    "being archived (generation {}, lease until {})",
                    m.generation,
                    m.lease_expires_at
                        .map_or_else(String::new, |t| t.to_string())
                ),
            ),
            BucketState::Archiving => match paused {
                Some(why) => (false, format!("claim expired; {why}")),
                None => (
                    true,
                    "claim expired: the next archiver takes it over".into(),
                ),
            },
            BucketState::Hot => {
                let end = m.id.bucket_key.end();
                // The cutoff now, and the first instant it reaches this bucket's end.
                let (cutoff, from, by) = match self.policy.and_then(|p| p.archive_after) {
                    Some(after) => (
                        minus(self.now, after),
                        plus(end, after),
                        format!("archive_after {}", format_duration(after)),
                    ),
                    None => {
                        let cutoff = crate::archiver::config::january_first_of_previous_year(
                            self.now.to_datetime(),
                        );
                        (
                            cutoff.as_micros(),
                            default_cutoff_reaches(end),
                            format!("the default cutoff {cutoff}"),
                        )
                    }
                };
                if end.as_micros() > cutoff {
                    let from = from.map_or_else(|| "later".to_string(), |t| t.to_string());
                    return (
                        false,
                        format!("not yet: held by {by}, eligible from {from}"),
                    );
                }
                if let Some(why) = paused {
                    return (false, why.to_string());
                }
                if let Some(retry) = m.retry_at.filter(|t| t.as_micros() > now) {
                    return (false, format!("deferred: retry after {retry}"));
                }
                (true, format!("eligible by {by}"))
            }
        }
    }
}

/// What `\buckets [TABLE]` shows: the queue (every bucket not yet archived and cleaned up),
/// oldest first and cut at a limit, how many there are in all, and a count per table, state
/// and eligibility.
pub struct QueueView {
    /// The queue's columns.
    pub queue_schema: SchemaRef,
    /// The first rows of the queue, at most the limit asked for.
    pub queue: Vec<RecordBatch>,
    /// Rows in `queue`.
    pub shown: usize,
    /// Buckets in the whole queue.
    pub total: usize,
    /// The counts' columns.
    pub counts_schema: SchemaRef,
    /// Buckets per table, state and eligibility (archived ones included).
    pub counts: Vec<RecordBatch>,
}

/// Builds the queue view over `pulpitum_buckets` with DataFrame filters, so a table name is
/// a value, never SQL text. A name that is not a registered table is an error naming it,
/// not an empty answer.
pub async fn view(ctx: &SessionContext, table: Option<&str>, limit: usize) -> DFResult<QueueView> {
    use datafusion::functions_aggregate::count::count;
    if let Some(name) = table {
        let found = ctx
            .table("pulpitum_tables")
            .await?
            .filter(col("table_id").eq(lit(name)))?
            .count()
            .await?;
        if found == 0 {
            return Err(DataFusionError::Plan(format!(
                "no table named {name:?} (\\d lists the tables)"
            )));
        }
    }
    let mut df = ctx.table("pulpitum_buckets").await?;
    if let Some(name) = table {
        df = df.filter(col("table_id").eq(lit(name)))?;
    }
    let counts = df
        .clone()
        .aggregate(
            vec![col("table_id"), col("state"), col("eligible")],
            vec![count(lit(1)).alias("buckets")],
        )?
        .sort(vec![
            col("table_id").sort(true, false),
            col("state").sort(true, false),
            col("eligible").sort(false, false),
        ])?;
    let queued = df.filter(
        col("state")
            .not_eq(lit("archived"))
            .or(col("hot_rows_deleted").eq(lit(false))),
    )?;
    let total = queued.clone().count().await?;
    let queue = queued
        .sort(vec![
            col("bucket_end").sort(true, false),
            col("table_id").sort(true, false),
            col("partition_key").sort(true, false),
        ])?
        .limit(0, Some(limit))?
        .select_columns(&[
            "table_id",
            "partition",
            "bucket_key",
            "state",
            "eligible",
            "reason",
        ])?;
    let (queue_schema, queue) = collect(queue).await?;
    let (counts_schema, counts) = collect(counts).await?;
    Ok(QueueView {
        shown: queue.iter().map(RecordBatch::num_rows).sum(),
        queue_schema,
        queue,
        total,
        counts_schema,
        counts,
    })
}

async fn collect(df: DataFrame) -> DFResult<(SchemaRef, Vec<RecordBatch>)> {
    let schema: SchemaRef = std::sync::Arc::new(df.schema().as_arrow().clone());
    Ok((schema, df.collect().await?))
}

/// The sum of an `Int64` column over batches (the `buckets` counts), for summaries.
pub fn sum_counts(batches: &[RecordBatch], column: &str) -> i64 {
    batches
        .iter()
        .filter_map(|b| b.column_by_name(column))
        .filter_map(|c| c.as_any().downcast_ref::<Int64Array>())
        .flat_map(|a| a.iter().flatten())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{BucketId, BucketKey, PartitionKey, TableId};

    fn hot(key: &str) -> BucketMeta {
        BucketMeta {
            id: BucketId {
                table_id: TableId::new("chat").unwrap(),
                partition_key: PartitionKey::new(vec![1]).unwrap(),
                bucket_key: BucketKey::parse_any(key).unwrap(),
            },
            state: BucketState::Hot,
            generation: 0,
            owner_token: None,
            lease_expires_at: None,
            retry_at: None,
            published_at: None,
        }
    }

    fn at(s: &str) -> EventTime {
        EventTime::parse_rfc3339(s).unwrap()
    }

    /// The "eligible from" time follows the documented rule and does not move with the
    /// clock of the query (it did: the default cutoff's time was shifted by `now`).
    #[test]
    fn eligible_from_follows_the_rule_and_is_stable() {
        let bucket = hot("day:2026-09-04");
        for now in [
            "2026-11-01T00:00:00Z",
            "2026-11-01T00:00:07Z",
            "2027-06-30T12:00:00Z",
        ] {
            let judge = Judge {
                now: at(now),
                policy: None,
                store_paused: false,
            };
            let (eligible, reason) = judge.judge(&bucket);
            assert!(!eligible);
            assert!(
                reason.ends_with("eligible from 2028-01-01T00:00:00Z"),
                "{now}: {reason}"
            );
        }
        let policy = TablePolicy {
            archive_after: Some(Duration::from_secs(90 * 86_400)),
            ..TablePolicy::none(TableId::new("chat").unwrap())
        };
        for now in ["2026-09-06T00:00:00Z", "2026-10-01T00:00:09Z"] {
            let judge = Judge {
                now: at(now),
                policy: Some(&policy),
                store_paused: false,
            };
            let (_, reason) = judge.judge(&bucket);
            // 2026-09-05 (the bucket's end) + 90 days.
            assert_eq!(
                reason,
                "not yet: held by archive_after 90 days, eligible from 2026-12-04T00:00:00Z"
            );
        }
        let judge = Judge {
            now: at("2028-01-01T00:00:00Z"),
            policy: None,
            store_paused: false,
        };
        assert!(judge.judge(&bucket).0, "eligible at the instant named");
    }
}

//! DELETE and UPDATE against the archiver: a bucket being archived refuses the statement
//! with a retryable error and changes nothing; statements racing a running archiver (with
//! compaction) are either applied exactly or refused retryably, never half applied or
//! silently skipped. PostgreSQL and the embedded store, real S3.

mod archiver_support;
mod changes_support;

use std::sync::Arc;
use std::time::Duration;

use changes_support::*;
use pulpitum::archiver::{ArchiverConfig, Runner};
use pulpitum::model::{encode_i64, BucketId, EventTime, PartitionKey, Record, SortKey};
use pulpitum::store::BucketFilter;
use tokio_util::sync::CancellationToken;

fn record(ch: i64, id: i64, t: i64, content: &str) -> Record {
    Record {
        partition_key: PartitionKey::from_i64(ch),
        event_time: EventTime::from_micros(t).unwrap(),
        sort_key: SortKey::new(encode_i64(id).to_vec()).unwrap(),
        value: content.as_bytes().to_vec(),
    }
}

async fn fenced(embedded: bool) {
    let env = Env::new(
        if embedded {
            "chg_fence_sq"
        } else {
            "chg_fence_pg"
        },
        embedded,
    )
    .await;
    let t0 = EventTime::parse_rfc3339(START).unwrap().as_micros();
    let mut model = Model::new();
    let mut recs = Vec::new();
    for id in 0..5 {
        recs.push(record(1, id, t0 + id, "a"));
        model.insert((1, id), (t0 + id, "a".into()));
    }
    env.store.append_batch(&env.table, &recs).await.unwrap();
    let bucket: BucketId = env
        .store
        .list_buckets(&env.table, &BucketFilter::default())
        .await
        .unwrap()
        .remove(0)
        .id;
    let claim = env
        .store
        .claim(&bucket, Duration::from_secs(60))
        .await
        .unwrap()
        .expect("claimable");
    for sql in [
        "DELETE FROM chat WHERE channel_id = 1 AND id = 2",
        "UPDATE chat SET content = 'b' WHERE channel_id = 1",
    ] {
        let e = env.change(sql).await.unwrap_err();
        assert!(
            e.contains("is being archived") && e.contains("nothing was changed, retry"),
            "{sql}: {e}"
        );
    }
    assert_same(&env.dump().await, &model, "a fenced bucket is unchanged");
    // Handed back to Hot (the archiver deferred it): the same statements apply.
    env.store
        .defer_archive(&claim, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(
        env.change("DELETE FROM chat WHERE channel_id = 1 AND id = 2")
            .await
            .unwrap(),
        1
    );
    model.remove(&(1, 2));
    assert_eq!(
        env.change("UPDATE chat SET content = 'b' WHERE channel_id = 1")
            .await
            .unwrap(),
        4
    );
    for v in model.values_mut() {
        v.1 = "b".into();
    }
    assert_same(
        &env.dump().await,
        &model,
        "after the bucket went back to Hot",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bucket_being_archived_refuses_changes_retryably_on_postgres() {
    fenced(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bucket_being_archived_refuses_changes_retryably_embedded() {
    fenced(true).await;
}

/// Runs `sql` until it is applied, retrying the refusals that say to; returns its count.
async fn until_applied(env: &Env, sql: &str) -> u64 {
    for _ in 0..200 {
        match env.change(sql).await {
            Ok(n) => return n,
            Err(e) if e.contains("retry the statement") || e.contains("kept conflicting") => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(e) => panic!("{sql}: {e}"),
        }
    }
    panic!("{sql}: still refused after 200 attempts");
}

async fn race(embedded: bool) {
    let env = Arc::new(
        Env::new(
            if embedded {
                "chg_race_sq"
            } else {
                "chg_race_pg"
            },
            embedded,
        )
        .await,
    );
    let t0 = EventTime::parse_rfc3339(START).unwrap().as_micros();
    let mut model = Model::new();
    let mut recs = Vec::new();
    // 4 channels x 12 days x 5 messages: 48 buckets for the archiver to take while the
    // statements run.
    for ch in 1..=4 {
        for day in 0..12 {
            for k in 0..5 {
                let id = ch * 10_000 + day * 10 + k;
                let t = t0 + day * DAY_US + k;
                recs.push(record(ch, id, t, &format!("m{id}")));
                model.insert((ch, id), (t, format!("m{id}")));
            }
        }
    }
    env.store.append_batch(&env.table, &recs).await.unwrap();
    let mut c = ArchiverConfig::with_defaults();
    c.eligible_before = Some(EventTime::parse_rfc3339("2022-01-01T00:00:00Z").unwrap());
    c.cleanup_delay = Duration::ZERO;
    c.interval = Duration::from_millis(20);
    c.scan_limit = 3;
    c.concurrency = 2;
    c.compact_after = Duration::ZERO;
    let runner = Runner::new(env.store.clone(), env.archive.clone(), c).unwrap();
    let stop = CancellationToken::new();
    let archiver = {
        let stop = stop.clone();
        tokio::spawn(async move { runner.run(stop).await })
    };
    // Every third message deleted and every fourth edited, bucket by bucket, in the order
    // the archiver takes them, each until applied; the counts must be exact.
    let keys: Vec<(i64, i64)> = model.keys().copied().collect();
    for (i, (ch, id)) in keys.iter().enumerate() {
        if i % 3 == 0 {
            let n = until_applied(
                &env,
                &format!("DELETE FROM chat WHERE channel_id = {ch} AND id = {id}"),
            )
            .await;
            assert_eq!(n, 1, "delete of ({ch}, {id})");
            model.remove(&(*ch, *id));
        } else if i % 4 == 0 {
            let n = until_applied(
                &env,
                &format!("UPDATE chat SET content = content || '+' WHERE channel_id = {ch} AND id = {id}"),
            )
            .await;
            assert_eq!(n, 1, "update of ({ch}, {id})");
            model.get_mut(&(*ch, *id)).unwrap().1.push('+');
        }
    }
    // A statement over many buckets at once, while the archiver still runs.
    let expect = model.keys().filter(|(ch, _)| *ch == 4).count() as u64;
    assert_eq!(
        until_applied(&env, "DELETE FROM chat WHERE channel_id = 4").await,
        expect
    );
    model.retain(|(ch, _), _| *ch != 4);
    stop.cancel();
    archiver.await.unwrap().unwrap();
    assert_same(&env.dump().await, &model, "after the race");
    // Everything archived (and compacted where due) afterwards keeps every change.
    env.archive_before(
        "2022-01-01T00:00:00Z",
        pulpitum::archive::PayloadFormat::Parquet,
        true,
    )
    .await;
    assert_same(&env.dump().await, &model, "after archiving everything");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn changes_racing_the_archiver_on_postgres() {
    race(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn changes_racing_the_archiver_embedded() {
    race(true).await;
}

//! `DELETE` and `UPDATE` over both tiers, against PostgreSQL and the embedded store, with
//! the real S3: hot rows change in place, archived rows (per-bucket objects in both formats,
//! and segments) are masked at once, a bucket being archived refuses the statement with a
//! retryable error, counts are exact, and a random sequence of statements with archiving
//! runs in between answers exactly as a plain PostgreSQL table does.

mod archiver_support;
mod changes_support;

use changes_support::*;
use datafusion::arrow::record_batch::RecordBatch;
use pulpitum::archive::PayloadFormat;
use pulpitum::model::{encode_i64, EventTime, PartitionKey, Record, SortKey};
use pulpitum::session::{session, SessionOptions};
use pulpitum::store::BucketState;

/// The day offset of message `i`: ten a day, the first four days in March, the rest in
/// April (so March's window is complete once its days are archived, and can be compacted).
fn day_of(i: i64) -> i64 {
    let d = i / 10;
    if d >= 4 {
        d + 31
    } else {
        d
    }
}

/// `channels` channels of `per_channel` messages, ten a day from [`START`] (see [`day_of`]).
fn rows(channels: i64, per_channel: i64) -> (Vec<Record>, Model) {
    let base = EventTime::parse_rfc3339(START).unwrap().as_micros();
    let mut out = Vec::new();
    let mut model = Model::new();
    for ch in 1..=channels {
        for i in 0..per_channel {
            let id = ch * 1_000 + i;
            let t = base + day_of(i) * DAY_US + i;
            let content = format!("c{ch} m{i}");
            out.push(Record {
                partition_key: PartitionKey::from_i64(ch),
                event_time: EventTime::from_micros(t).unwrap(),
                sort_key: SortKey::new(encode_i64(id).to_vec()).unwrap(),
                value: content.clone().into_bytes(),
            });
            model.insert((ch, id), (t, content));
        }
    }
    (out, model)
}

/// The statements of the tier test, checked against the model after each.
async fn exercise(env: &Env, model: &mut Model) {
    // One archived message (day 0), by its key.
    assert_eq!(
        env.change("DELETE FROM chat WHERE channel_id = 1 AND id = 1003")
            .await
            .unwrap(),
        1
    );
    model.remove(&(1, 1003));
    assert_same(&env.dump().await, model, "after deleting one archived row");
    // Again: nothing left to delete.
    assert_eq!(
        env.change("DELETE FROM chat WHERE channel_id = 1 AND id = 1003")
            .await
            .unwrap(),
        0
    );
    // An edit of an archived row, then found by its new body (a filter on the value).
    assert_eq!(
        env.change("UPDATE chat SET content = 'edited' WHERE channel_id = 2 AND id = 2011")
            .await
            .unwrap(),
        1
    );
    model.get_mut(&(2, 2011)).unwrap().1 = "edited".into();
    let b = env
        .sql("SELECT id FROM chat WHERE content = 'edited'")
        .await
        .unwrap();
    assert_eq!(b.iter().map(RecordBatch::num_rows).sum::<usize>(), 1);
    // Edited twice: the second edit matches the first's body.
    assert_eq!(
        env.change("UPDATE chat SET content = content || '!' WHERE content = 'edited'")
            .await
            .unwrap(),
        1
    );
    model.get_mut(&(2, 2011)).unwrap().1 = "edited!".into();
    // A predicate over both tiers (days 0-3 archived, 4-5 hot), by an expression.
    let expect: Vec<(i64, i64)> = model
        .keys()
        .filter(|(ch, id)| *ch == 2 && id % 3 == 0)
        .copied()
        .collect();
    assert_eq!(
        env.change("DELETE FROM chat WHERE channel_id = 2 AND id % 3 = 0")
            .await
            .unwrap(),
        expect.len() as u64
    );
    for k in expect {
        model.remove(&k);
    }
    // An update of every row of a channel, hot and archived, with an expression of the row.
    let n = model.keys().filter(|(ch, _)| *ch == 1).count() as u64;
    assert_eq!(
        env.change("UPDATE chat SET content = concat(content, '/', CAST(id AS VARCHAR)) WHERE channel_id = 1").await.unwrap(),
        n
    );
    for ((ch, id), (_, c)) in model.iter_mut() {
        if *ch == 1 {
            *c = format!("{c}/{id}");
        }
    }
    // A time range: everything of day 35 (hot) and day 1 (archived) in channel 3.
    let day = |d: i64| {
        EventTime::from_micros(EventTime::parse_rfc3339(START).unwrap().as_micros() + d * DAY_US)
            .unwrap()
            .to_datetime()
            .to_rfc3339()
    };
    let expect: Vec<(i64, i64)> = model
        .iter()
        .filter(|((ch, _), (t, _))| {
            let d = (t - EventTime::parse_rfc3339(START).unwrap().as_micros()) / DAY_US;
            *ch == 3 && (d == 1 || d == 35)
        })
        .map(|(k, _)| *k)
        .collect();
    let sql = format!(
        "DELETE FROM chat WHERE channel_id = 3 AND ((timestamp >= TIMESTAMP '{}' AND timestamp < TIMESTAMP '{}') OR (timestamp >= TIMESTAMP '{}' AND timestamp < TIMESTAMP '{}'))",
        day(1), day(2), day(35), day(36)
    );
    assert_eq!(env.change(&sql).await.unwrap(), expect.len() as u64);
    for k in expect {
        model.remove(&k);
    }
    assert_same(&env.dump().await, model, "after the statements");
    // A WHERE that is never true changes nothing, however the optimizer simplifies it (it
    // turns these into an empty relation, which once left the change with no predicate).
    for sql in [
        "DELETE FROM chat WHERE false",
        "DELETE FROM chat WHERE channel_id = 2 AND id IS NULL",
        "DELETE FROM chat WHERE id = 1004 AND id = 2004",
        "DELETE FROM chat WHERE content = NULL",
        "DELETE FROM chat WHERE id IN (1001, 1002) AND id IN (1005, 1006)",
        "UPDATE chat SET content = 'lost' WHERE channel_id = 1 AND 1 = 0",
        "UPDATE chat SET content = 'lost' WHERE NULL",
    ] {
        assert_eq!(env.change(sql).await.unwrap(), 0, "{sql}");
    }
    assert_same(
        &env.dump().await,
        model,
        "a WHERE that is never true changed something",
    );
    // A WHERE that repeats an expression (the optimizer shares it through a projection).
    let expect: Vec<(i64, i64)> = model
        .keys()
        .filter(|(ch, id)| *ch == 3 && (id % 7 == 1 || id % 7 == 2))
        .copied()
        .collect();
    assert!(!expect.is_empty());
    assert_eq!(
        env.change("UPDATE chat SET content = concat(content, '#') WHERE channel_id = 3 AND (id % 7 = 1 OR id % 7 = 2)")
            .await
            .unwrap(),
        expect.len() as u64
    );
    for k in &expect {
        model.get_mut(k).unwrap().1.push('#');
    }
    assert_eq!(
        env.change("DELETE FROM chat WHERE channel_id = 3 AND (id % 7 = 1 OR id % 7 = 2)")
            .await
            .unwrap(),
        expect.len() as u64
    );
    for k in &expect {
        model.remove(k);
    }
    // A prepared DELETE binds its parameters at each execution.
    let delete = pulpitum::prepared::prepare(
        &env.ctx,
        "DELETE FROM chat WHERE channel_id = $1 AND id = $2",
    )
    .await
    .unwrap();
    let key = *model.keys().find(|(ch, _)| *ch == 2).unwrap();
    for want in [1, 0] {
        let values = [
            datafusion::common::ScalarValue::Int64(Some(key.0)),
            datafusion::common::ScalarValue::Int64(Some(key.1)),
        ];
        assert_eq!(
            count(&delete.execute(&values).await.unwrap()).unwrap(),
            want
        );
    }
    model.remove(&key);
    assert_same(&env.dump().await, model, "after the sealed statements");
    // Key columns cannot be assigned; subqueries are refused before they could widen a DELETE.
    let e = env
        .change("UPDATE chat SET id = 5 WHERE channel_id = 1")
        .await
        .unwrap_err();
    assert!(e.contains("UPDATE may set only content"), "{e}");
    let e = env
        .change("DELETE FROM chat WHERE id IN (SELECT id FROM chat WHERE channel_id = 99)")
        .await
        .unwrap_err();
    assert!(e.contains("subquery"), "{e}");
    let e = env
        .change("UPDATE chat SET content = NULL WHERE channel_id = 3")
        .await
        .unwrap_err();
    assert!(e.contains("NULL"), "{e}");
    assert_same(
        &env.dump().await,
        model,
        "refused statements changed nothing",
    );
    // A fresh session (another process) sees the same table.
    let fresh = session(
        env.store.clone(),
        env.archive.clone(),
        SessionOptions::default(),
    )
    .await
    .unwrap();
    assert_same(&dump(&fresh).await, model, "a fresh session");
}

async fn tiers(label: &str, embedded: bool, format: PayloadFormat, segments: bool) {
    let env = Env::new(label, embedded).await;
    let (records, mut model) = rows(3, 60);
    env.store.append_batch(&env.table, &records).await.unwrap();
    // Days 0..4 archived, 4 and 5 hot.
    let before =
        EventTime::from_micros(EventTime::parse_rfc3339(START).unwrap().as_micros() + 4 * DAY_US)
            .unwrap()
            .to_datetime()
            .to_rfc3339();
    env.archive_before(&before, format, segments).await;
    let states = env.states().await;
    let archived = states
        .iter()
        .filter(|s| matches!(s, BucketState::Archived { .. }))
        .count();
    assert_eq!(archived, 12, "{states:?}");
    if segments {
        assert!(states.iter().any(|s| matches!(s, BucketState::Archived { object_key, .. } if object_key.contains("/segments/"))), "{states:?}");
    }
    assert_same(&env.dump().await, &model, "after archiving");
    exercise(&env, &mut model).await;
    // Archiving the rest afterwards keeps every change (hot rows changed in place are
    // archived as changed; masks stay on the archived ones).
    env.archive_before("2022-01-01T00:00:00Z", format, segments)
        .await;
    assert!(env
        .states()
        .await
        .iter()
        .all(|s| matches!(s, BucketState::Archived { .. })));
    assert_same(&env.dump().await, &model, "after archiving the rest");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_parquet_objects() {
    tiers("chg_pg_parquet", false, PayloadFormat::Parquet, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_json_objects() {
    tiers("chg_pg_json", false, PayloadFormat::Json, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_segments() {
    tiers("chg_pg_seg", false, PayloadFormat::Parquet, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn embedded_parquet_objects() {
    tiers("chg_sq_parquet", true, PayloadFormat::Parquet, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn embedded_json_segments() {
    tiers("chg_sq_seg", true, PayloadFormat::Json, true).await;
}

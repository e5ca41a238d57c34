//! The wire server against a hostile client, in process (so a panic in any connection task
//! is counted, not just survived): nothing runs before a login whatever the message order,
//! protocol or TLS state; malformed and truncated frames in every connection state neither
//! panic nor leak a slot; roles decide what runs, on the planned statement; a client changes
//! only its own session; memory limits answer 53200 while others carry on; results stream.
//!
//! Each test serves an embedded store seeded with a small `chat` table, with three users:
//! alice (admin), bob (write) and carol (read).

#[path = "support/rawpg.rs"]
mod rawpg;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pulpitum::server::{Role, Server, ServerConfig, Users};
use pulpitum::session::{session, SessionOptions};
use pulpitum::store::HotStore;
use rand::{Rng, SeedableRng};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_postgres::{Client, NoTls, SimpleQueryMessage};
use tokio_util::sync::CancellationToken;

use rawpg::{read_all, Msg};

const PASSWORD: &str = "correct horse";

/// Panics outside the tests' own assertions (in the server's tasks, the library, its
/// dependencies), counted by a hook installed once.
static PANICS: AtomicUsize = AtomicUsize::new(0);

fn count_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let in_tests = info
                .location()
                .is_some_and(|l| l.file().starts_with("tests/"));
            // A server of an earlier test whose runtime is being shut down in the background
            // (`shutdown_background`, as the test's runtime ends) may still poll a
            // connection's timer on the way out, which tokio refuses with this panic. It
            // happens after that server's test, never while a server serves, and was seen
            // to fail four later tests at once on a loaded machine.
            let shutting_down = info
                .payload()
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| info.payload().downcast_ref::<&str>().copied())
                .is_some_and(|m| m.contains("context was found, but it is being shutdown"));
            if !in_tests && !shutting_down {
                PANICS.fetch_add(1, Ordering::SeqCst);
            }
            previous(info);
        }));
    });
}

/// How long `slow_plan` blocks the thread that plans it, and how many calls began and ended.
const SLOW_PLAN: Duration = Duration::from_secs(4);
static SLOW_STARTED: AtomicUsize = AtomicUsize::new(0);
static SLOW_FINISHED: AtomicUsize = AtomicUsize::new(0);
/// `slow_plan` is shared by the tests of this binary: one test at a time uses it.
static SLOW_PLAN_USER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

struct Served {
    port: u16,
    stop: CancellationToken,
    /// The server's `run`, which ends once the server has stopped.
    run: tokio::task::JoinHandle<()>,
    store: Arc<dyn HotStore>,
    _dir: tempfile::TempDir,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn users() -> Users {
    let mut u = Users::default();
    u.add("alice", PASSWORD, Role::Admin, "test").unwrap();
    u.add("bob", PASSWORD, Role::Write, "test").unwrap();
    u.add("carol", PASSWORD, Role::Read, "test").unwrap();
    u
}

/// Serves a fresh embedded store with `chat` (channel 1: 10 rows) under `config`.
async fn serve(config: ServerConfig) -> Served {
    count_panics();
    let dir = tempfile::tempdir().unwrap();
    let store = pulpitum::store::open(&format!(
        "sqlite:{}",
        dir.path().join("hot.sqlite3").display()
    ))
    .await
    .unwrap();
    let archive = Arc::new(
        pulpitum::archive::ArchiveStore::from_url(&format!(
            "file://{}",
            dir.path().join("archive").display()
        ))
        .unwrap(),
    );
    let ctx = session(
        store.clone(),
        archive,
        SessionOptions {
            migrate: true,
            ..SessionOptions::default()
        },
    )
    .await
    .unwrap();
    ctx.sql(
        "CREATE EXTERNAL TABLE chat STORED AS PULPITUM LOCATION '' \
         OPTIONS ('surface' 'chat', 'bucket_strategy' 'calendar_day_utc')",
    )
    .await
    .unwrap();
    // `boom(x)`: a function that panics, standing for a panic anywhere in the engine (one was
    // seen in DataFusion's repartition under memory pressure). Immutable, so `boom(1)`
    // panics while the statement is planned (constant folding) and `boom(value)` while its
    // rows are produced.
    ctx.register_udf(datafusion::logical_expr::create_udf(
        "boom",
        vec![datafusion::arrow::datatypes::DataType::Int64],
        datafusion::arrow::datatypes::DataType::Int64,
        datafusion::logical_expr::Volatility::Immutable,
        Arc::new(|_: &[datafusion::logical_expr::ColumnarValue]| panic!("a secret of another row")),
    ));
    // `boom_at(x)`: panics on a batch holding a row where x = 0, passes x through otherwise.
    ctx.register_udf(datafusion::logical_expr::create_udf(
        "boom_at",
        vec![datafusion::arrow::datatypes::DataType::Int64],
        datafusion::arrow::datatypes::DataType::Int64,
        datafusion::logical_expr::Volatility::Immutable,
        Arc::new(|args: &[datafusion::logical_expr::ColumnarValue]| {
            use datafusion::arrow::array::AsArray;
            let arrays = datafusion::logical_expr::ColumnarValue::values_to_arrays(args)?;
            let values = arrays[0].as_primitive::<datafusion::arrow::datatypes::Int64Type>();
            assert!(
                !values.iter().any(|v| v == Some(0)),
                "a secret of another row"
            );
            Ok(datafusion::logical_expr::ColumnarValue::Array(
                arrays[0].clone(),
            ))
        }),
    ));
    // `slow_plan(x)`: a function that blocks its thread for `SLOW_PLAN`, standing for a
    // statement that plans slowly (planning never yields). Immutable, so it runs while the
    // statement is planned (constant folding), on whichever thread plans it.
    ctx.register_udf(datafusion::logical_expr::create_udf(
        "slow_plan",
        vec![datafusion::arrow::datatypes::DataType::Int64],
        datafusion::arrow::datatypes::DataType::Int64,
        datafusion::logical_expr::Volatility::Immutable,
        Arc::new(|args: &[datafusion::logical_expr::ColumnarValue]| {
            SLOW_STARTED.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(SLOW_PLAN);
            SLOW_FINISHED.fetch_add(1, Ordering::SeqCst);
            Ok(args[0].clone())
        }),
    ));
    let values: Vec<String> = (1..=10)
        .map(|i| {
            format!(
                "(1, TIMESTAMP '2026-01-0{}T00:00:00Z', {i}, 'm{i}')",
                1 + i % 9
            )
        })
        .collect();
    ctx.sql(&format!("INSERT INTO chat VALUES {}", values.join(", ")))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let server = Server::bind(
        ctx,
        ServerConfig {
            listen: "127.0.0.1:0".into(),
            ..config
        },
    )
    .await
    .unwrap();
    let port = server.local_addr().unwrap().port();
    let stop = CancellationToken::new();
    let run = tokio::spawn(server.run(stop.clone()));
    Served {
        port,
        stop,
        run,
        store,
        _dir: dir,
    }
}

fn with_users() -> ServerConfig {
    ServerConfig {
        users: Some(users()),
        ..ServerConfig::default()
    }
}

async fn connect(s: &Served, user: &str) -> Client {
    let (client, conn) = tokio_postgres::connect(
        &format!(
            "host=127.0.0.1 port={} user={user} password='{PASSWORD}' dbname=pulpitum sslmode=disable",
            s.port
        ),
        NoTls,
    )
    .await
    .unwrap_or_else(|e| panic!("{user} connects: {}", code(&e)));
    tokio::spawn(conn);
    client
}

fn code(e: &tokio_postgres::Error) -> String {
    e.as_db_error()
        .map(|d| format!("{}: {}", d.code().code(), d.message()))
        .unwrap_or_else(|| e.to_string())
}

async fn count(c: &Client, sql: &str) -> i64 {
    c.query_one(sql, &[]).await.unwrap().get(0)
}

async fn raw(s: &Served) -> TcpStream {
    TcpStream::connect(("127.0.0.1", s.port)).await.unwrap()
}

/// Sends `bytes` in one write and reads everything until the server closes; asserts it
/// closed after a FATAL error and sent nothing a statement would produce.
async fn refused_in_one_write(s: &Served, bytes: &[u8], what: &str) -> (String, String) {
    let mut sock = raw(s).await;
    sock.write_all(bytes).await.unwrap();
    let (msgs, closed) = read_all(&mut sock, Duration::from_secs(5)).await;
    assert!(closed, "{what}: the connection stays open: {msgs:?}");
    let kinds: Vec<char> = msgs.iter().map(|m| m.kind as char).collect();
    for k in ['C', 'D', 'T', 'Z', 'I', '1', '2'] {
        assert!(
            !kinds.contains(&k),
            "{what}: the server answered a statement ({kinds:?})"
        );
    }
    let last = msgs.last().and_then(Msg::error).unwrap_or_else(|| {
        panic!("{what}: no error before the close: {kinds:?}");
    });
    assert_eq!(last.0, "FATAL", "{what}: {last:?}");
    (last.1, last.2)
}

/// The sequences of issue 25, point 1, in one write each, on the simple and the extended
/// protocol, with and without TLS required: none of their statements runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_runs_before_a_login_whatever_the_order() {
    let s = serve(with_users()).await;
    let insert = "INSERT INTO chat VALUES (99, TIMESTAMP '2026-01-01T00:00:00Z', 1, 'pwned')";
    let mut sequences: Vec<(String, Vec<u8>)> = Vec::new();
    for user in ["alice", "mallory"] {
        for tail in [
            rawpg::query(insert),
            rawpg::extended(insert),
            rawpg::query("SYSTEM STOP MOVES"),
        ] {
            sequences.push((
                format!("{user}: unknown mechanism, then a statement"),
                [
                    rawpg::startup(user),
                    rawpg::sasl_initial("BOGUS-MECH", b"x"),
                    tail.clone(),
                ]
                .concat(),
            ));
            sequences.push((
                format!("{user}: a statement in place of the login"),
                [rawpg::startup(user), tail.clone()].concat(),
            ));
            sequences.push((
                format!("{user}: a truncated SASL message, then a statement"),
                [
                    rawpg::startup(user),
                    rawpg::frame(b'p', b"SCRAM-SHA-256\0\0\0\0\x40n,,"),
                    tail.clone(),
                ]
                .concat(),
            ));
        }
    }
    for (what, bytes) in &sequences {
        refused_in_one_write(&s, bytes, what).await;
    }
    // A wrong password, its final SCRAM message and a statement in one write.
    for tail in [
        rawpg::query(insert),
        rawpg::extended(insert),
        rawpg::query("SYSTEM STOP MOVES"),
    ] {
        let mut sock = raw(&s).await;
        let (last, _) = rawpg::scram_until_final(&mut sock, "alice", "wrong").await;
        sock.write_all(&[last, tail].concat()).await.unwrap();
        let (msgs, closed) = read_all(&mut sock, Duration::from_secs(5)).await;
        assert!(closed, "wrong password: still open: {msgs:?}");
        let e = msgs.iter().find_map(Msg::error).expect("an error");
        assert_eq!((e.0.as_str(), e.1.as_str()), ("FATAL", "28P01"), "{e:?}");
        assert!(!msgs.iter().any(|m| m.kind == b'C' || m.kind == b'Z'));
    }
    let admin = connect(&s, "alice").await;
    assert_eq!(
        count(&admin, "SELECT count(*) FROM chat").await,
        10,
        "no row was added"
    );
    let paused: bool = admin
        .query_one("SELECT bool_or(store_paused) FROM pulpitum_tables", &[])
        .await
        .unwrap()
        .get(0);
    assert!(!paused, "archiving was not paused");
    assert_eq!(PANICS.load(Ordering::SeqCst), 0);

    // With TLS required, plaintext is refused before anything else is read.
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = self_signed(dir.path());
    let tls = serve(ServerConfig {
        tls: Some((cert, key)),
        ..with_users()
    })
    .await;
    for tail in [rawpg::query(insert), rawpg::extended(insert)] {
        let (code, message) = refused_in_one_write(
            &tls,
            &[rawpg::startup("alice"), tail].concat(),
            "plaintext with TLS required",
        )
        .await;
        assert_eq!(code, "28000", "{message}");
    }
    // Bytes sent in the clear right after the SSLRequest never reach the TLS session.
    let mut sock = raw(&tls).await;
    sock.write_all(
        &[
            rawpg::ssl_request(),
            rawpg::startup("alice"),
            rawpg::query(insert),
        ]
        .concat(),
    )
    .await
    .unwrap();
    let (msgs, closed) = read_all(&mut sock, Duration::from_secs(5)).await;
    assert!(closed);
    let e = msgs.iter().find_map(Msg::error).expect("refused");
    assert!(e.2.contains("unencrypted data after SSL request"), "{e:?}");
}

fn self_signed(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let (cert, key) = (dir.join("server.crt"), dir.join("server.key"));
    let ok = std::process::Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args(["-subj", "/CN=localhost", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap()
        .success();
    assert!(ok, "openssl makes a certificate");
    (cert, key)
}

/// A client that starts and then says nothing is closed at the startup timeout, and its
/// slot serves the next client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_client_loses_its_slot_at_the_startup_timeout() {
    let s = serve(ServerConfig {
        max_connections: 1,
        startup_timeout: Duration::from_secs(1),
        ..with_users()
    })
    .await;
    let mut silent = raw(&s).await;
    silent.write_all(&rawpg::startup("alice")).await.unwrap();
    let started = std::time::Instant::now();
    let (msgs, closed) = read_all(&mut silent, Duration::from_secs(10)).await;
    assert!(closed, "closed at the timeout");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let e = msgs.iter().find_map(Msg::error).expect("told why");
    assert!(e.2.contains("authentication due to timeout"), "{e:?}");
    // The slot is free once the silent connection's task has ended (a moment after the
    // close the client sees).
    let mut c = None;
    for _ in 0..20 {
        let info = format!(
            "host=127.0.0.1 port={} user=carol password='{PASSWORD}' dbname=pulpitum sslmode=disable",
            s.port
        );
        if let Ok((client, conn)) = tokio_postgres::connect(&info, NoTls).await {
            tokio::spawn(conn);
            c = Some(client);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let c = c.expect("the slot serves the next client");
    assert_eq!(count(&c, "SELECT count(*) FROM chat").await, 10);
}

/// A name that is not configured gets a salt and the iteration count like a real user, the
/// same salt each time, and fails at the proof with the same error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_names_cannot_be_told_from_wrong_passwords() {
    let s = serve(with_users()).await;
    let (mut firsts, mut answers) = (Vec::new(), Vec::new());
    for user in ["alice", "mallory", "mallory"] {
        let mut sock = raw(&s).await;
        let (last, server_first) = rawpg::scram_until_final(&mut sock, user, "guess").await;
        let fields: Vec<&str> = server_first.split(',').collect();
        assert!(
            fields[0].starts_with("r=") && fields[1].starts_with("s="),
            "{server_first}"
        );
        assert_eq!(fields[2], "i=4096", "{server_first}");
        sock.write_all(&last).await.unwrap();
        let (msgs, closed) = read_all(&mut sock, Duration::from_secs(5)).await;
        assert!(closed);
        let e = msgs.iter().find_map(Msg::error).expect("refused");
        assert_eq!((e.0.as_str(), e.1.as_str()), ("FATAL", "28P01"), "{e:?}");
        answers.push(e.2);
        firsts.push(fields[1].to_string());
    }
    assert!(answers.iter().all(|a| *a == answers[0]), "{answers:?}");
    assert_eq!(
        firsts[1], firsts[2],
        "the same unknown name gets the same salt"
    );
    assert_ne!(firsts[0], firsts[1]);
    assert_eq!(firsts[0].len(), firsts[1].len());
}

/// A cancel request needs no connection slot: it is served when the server is full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_request_is_served_when_the_server_is_full() {
    let s = serve(ServerConfig {
        max_connections: 1,
        ..with_users()
    })
    .await;
    let c = connect(&s, "alice").await;
    let token = c.cancel_token();
    let slow = tokio::spawn(async move {
        c.simple_query("SELECT count(*) FROM generate_series(1, 20000000000)")
            .await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    token.cancel_query(NoTls).await.unwrap();
    let e = tokio::time::timeout(Duration::from_secs(10), slow)
        .await
        .expect("cancelled, not left to run")
        .unwrap()
        .expect_err("cancelled");
    assert!(code(&e).starts_with("57014"), "{}", code(&e));
}

/// Random and truncated frames, in every connection state, on many connections: no panic,
/// every slot comes back, nothing sent before a login ran, and the server answers after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_frames_in_every_state_neither_panic_nor_leak() {
    let s = serve(ServerConfig {
        max_connections: 4,
        startup_timeout: Duration::from_secs(2),
        ..with_users()
    })
    .await;
    let before = PANICS.load(Ordering::SeqCst);
    // Statements sent before a login insert into channel 666, after it into 777.
    let insert = |ch: i64| {
        format!("INSERT INTO chat VALUES ({ch}, TIMESTAMP '2026-01-01T00:00:00Z', 1, 'x')")
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(25);
    let (mut sequences, mut fatal, mut closed_quietly) = (0, 0, 0);
    for round in 0..400u32 {
        let state = round % 4;
        let mut sock = raw(&s).await;
        // Reach the state: 0 before the StartupMessage, 1 during authentication, 2 and 3
        // logged in (3 after a failed extended message, waiting for Sync).
        match state {
            0 => {}
            1 => sock.write_all(&rawpg::startup("alice")).await.unwrap(),
            _ => {
                rawpg::login(&mut sock, "bob", PASSWORD).await.unwrap();
                if state == 3 {
                    sock.write_all(&rawpg::frame(b'P', b"\0SELEC\0\0\0"))
                        .await
                        .unwrap();
                }
            }
        }
        let marker = insert(if state < 2 { 666 } else { 777 });
        let marker = marker.as_str();
        let mut bytes = Vec::new();
        for _ in 0..rng.random_range(1..6) {
            let pick = rng.random_range(0..8);
            let piece = match pick {
                0 => rawpg::query(marker),
                1 => rawpg::extended(marker),
                2 => {
                    // A valid type with a random body.
                    let kind = *b"QPBDECHSdcfp".get(rng.random_range(0..12)).unwrap();
                    let body: Vec<u8> =
                        (0..rng.random_range(0..40)).map(|_| rng.random()).collect();
                    rawpg::frame(kind, &body)
                }
                3 => {
                    // A length that lies.
                    let mut f = rawpg::query("SELECT 1");
                    let lie: i32 = rng.random_range(-10..100_000);
                    f[1..5].copy_from_slice(&lie.to_be_bytes());
                    f
                }
                4 => {
                    // A Parse whose parameter count exceeds its body (pgwire panicked here).
                    let mut body = b"\0SELECT $1\0".to_vec();
                    body.extend_from_slice(&(rng.random_range(1..500i16)).to_be_bytes());
                    rawpg::frame(b'P', &body)
                }
                5 => (0..rng.random_range(1..64)).map(|_| rng.random()).collect(),
                6 => rawpg::startup("alice"),
                _ => {
                    let mut f = rawpg::extended(marker);
                    f.truncate(rng.random_range(1..f.len()));
                    f
                }
            };
            bytes.extend_from_slice(&piece);
        }
        sequences += 1;
        // In random chunks, sometimes with a pause between them.
        let mut at = 0;
        while at < bytes.len() {
            let n = rng.random_range(1..=bytes.len() - at);
            if sock.write_all(&bytes[at..at + n]).await.is_err() {
                break;
            }
            at += n;
            if rng.random_bool(0.2) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        let (msgs, closed) = read_all(&mut sock, Duration::from_millis(300)).await;
        if msgs.iter().filter_map(Msg::error).any(|e| e.0 == "FATAL") {
            fatal += 1;
        } else if closed {
            closed_quietly += 1;
        }
    }
    eprintln!(
        "fuzz: {sequences} connections, {fatal} ended with FATAL, {closed_quietly} closed \
         without one, {} panics",
        PANICS.load(Ordering::SeqCst) - before
    );
    assert_eq!(PANICS.load(Ordering::SeqCst), before, "no panic");
    assert!(fatal > 100, "most sequences break the protocol: {fatal}");
    // Every slot came back (connections still open close within the startup timeout or
    // when dropped): the server takes its full four logins again, and answers.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(connect(&s, "alice").await);
    }
    assert_eq!(
        count(&held[0], "SELECT count(*) FROM chat WHERE channel_id = 666").await,
        0,
        "nothing sent before a login ran"
    );
    let after = count(&held[0], "SELECT count(*) FROM chat WHERE channel_id = 777").await;
    eprintln!(
        "fuzz: {after} statements sent after a login ran (their inserts are idempotent keys)"
    );
    assert_eq!(
        count(&held[0], "SELECT count(*) FROM chat WHERE channel_id = 1").await,
        10
    );
}

/// What each role may run, on both protocols; control statements are judged on the same
/// path; the job history's details are the admin's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_decide_what_runs() {
    let s = serve(with_users()).await;
    let bucket = pulpitum::model::BucketId {
        table_id: pulpitum::model::TableId::new("chat").unwrap(),
        partition_key: pulpitum::model::PartitionKey::new(pulpitum::model::encode_i64(1)).unwrap(),
        bucket_key: pulpitum::model::BucketKey::parse(
            pulpitum::model::BucketStrategy::CalendarDayUtc,
            "day:2026-01-02",
        )
        .unwrap(),
    };
    s.store
        .record_job_end(&pulpitum::store::JobEnd {
            job: pulpitum::store::JobStart {
                bucket,
                generation: 1,
                kind: pulpitum::store::JobKind::Archive,
                worker: "archiver-7@host".into(),
            },
            outcome: pulpitum::store::JobOutcome::Deferred,
            rows: None,
            bytes: None,
            error: Some("upload failed: bucket-internal detail".into()),
        })
        .await
        .unwrap();
    let insert = "INSERT INTO chat VALUES (2, TIMESTAMP '2026-01-01T00:00:00Z', 1, 'r')";
    let control = [
        "ALTER TABLE chat SET (archive_after = '30 days')",
        "SYSTEM STOP MOVES chat",
        "SYSTEM START MOVES",
    ];
    let jobs = "SELECT worker, error FROM pulpitum_jobs";
    for (user, may_insert, may_control) in [
        ("carol", false, false),
        ("bob", true, false),
        ("alice", true, true),
    ] {
        let c = connect(&s, user).await;
        assert_eq!(
            count(&c, "SELECT count(*) FROM chat WHERE channel_id = 1").await,
            10
        );
        for extended in [false, true] {
            let r = if extended {
                c.execute(insert, &[]).await.map(|_| ())
            } else {
                c.simple_query(insert).await.map(|_| ())
            };
            match (r, may_insert) {
                (Ok(()), true) => {}
                (Err(e), false) => assert!(
                    code(&e).starts_with("42501: permission denied: INSERT needs the write role"),
                    "{user}: {}",
                    code(&e)
                ),
                (r, _) => panic!("{user} insert (extended {extended}): {r:?}"),
            }
            for stmt in control {
                let r = if extended {
                    c.query(stmt, &[]).await.map(|_| ())
                } else {
                    c.simple_query(stmt).await.map(|_| ())
                };
                match (r, may_control) {
                    (Ok(()), true) => {}
                    (Err(e), false) => assert!(
                        code(&e).starts_with("42501: permission denied: a control statement"),
                        "{user} {stmt}: {}",
                        code(&e)
                    ),
                    (r, _) => panic!("{user} {stmt} (extended {extended}): {r:?}"),
                }
            }
        }
        // Edits and deletes follow the write role too, and report exact counts: the row
        // inserted above (when this user may insert) is edited once, then deleted once.
        let edit = "UPDATE chat SET content = 'edited' WHERE channel_id = 2 AND id = 1";
        let delete = "DELETE FROM chat WHERE channel_id = 2 AND id = 1";
        for (stmt, extended) in [(edit, true), (delete, false), (delete, true)] {
            let r = if extended {
                c.execute(stmt, &[]).await
            } else {
                c.simple_query(stmt).await.map(|m| {
                    m.iter()
                        .find_map(|m| match m {
                            tokio_postgres::SimpleQueryMessage::CommandComplete(n) => Some(*n),
                            _ => None,
                        })
                        .expect("a command tag")
                })
            };
            match (r, may_insert) {
                // The second DELETE finds nothing left.
                (Ok(n), true) => assert_eq!(
                    n,
                    u64::from(!(stmt == delete && extended)),
                    "{user} {stmt} (extended {extended})"
                ),
                (Err(e), false) => assert!(
                    code(&e).starts_with("42501: permission denied"),
                    "{user} {stmt}: {}",
                    code(&e)
                ),
                (r, _) => panic!("{user} {stmt} (extended {extended}): {r:?}"),
            }
        }
        assert_eq!(
            count(&c, "SELECT count(*) FROM chat WHERE channel_id = 2").await,
            0,
            "{user}: the deleted row is gone"
        );
        let row = c.query_one(jobs, &[]).await.unwrap();
        let (worker, error): (Option<String>, Option<String>) = (row.get(0), row.get(1));
        if may_control {
            assert_eq!(worker.as_deref(), Some("archiver-7@host"));
            assert!(error.unwrap().contains("bucket-internal detail"));
        } else {
            assert_eq!((worker, error), (None, None), "{user} sees no job details");
        }
    }
    let policy: Option<String> = connect(&s, "alice")
        .await
        .query_one(
            "SELECT archive_after FROM pulpitum_tables WHERE table_id = 'chat'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        policy.as_deref(),
        Some("30 days"),
        "only alice's statement applied"
    );
}

/// DDL is refused on the plan, whatever the text looks like, and leaves nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_that_create_or_read_files_are_refused_on_their_plan() {
    let s = serve(with_users()).await;
    let c = connect(&s, "alice").await;
    for sql in [
        "SELECT count(*) INTO squat FROM chat",
        "WITH x AS (SELECT 1 AS a) SELECT a INTO squat2 FROM x",
        "CREATE TABLE t AS SELECT 1",
        "CREATE VIEW v AS SELECT 1",
        "DECLARE c CURSOR FOR SELECT 1 INTO squat3",
        "CREATE EXTERNAL TABLE f STORED AS CSV LOCATION '/etc/passwd'",
        "CREATE EXTERNAL TABLE p STORED AS PULPITUM LOCATION ''",
        "COPY (SELECT 1) TO '/tmp/pulpitum-wire-never.csv'",
        "PREPARE p AS SELECT 1",
        "DROP TABLE chat",
    ] {
        for extended in [false, true] {
            let e = if extended {
                c.query(sql, &[]).await.map(|_| ()).expect_err(sql)
            } else {
                c.simple_query(sql).await.map(|_| ()).expect_err(sql)
            };
            assert!(
                code(&e).starts_with("42501"),
                "{sql} (extended {extended}): {}",
                code(&e)
            );
        }
    }
    for name in ["squat", "squat2", "squat3", "t", "v", "f", "p"] {
        let e = c
            .simple_query(&format!("SELECT * FROM {name}"))
            .await
            .expect_err(name);
        assert!(code(&e).starts_with("42P01"), "{name}: {}", code(&e));
    }
    assert!(!std::path::Path::new("/tmp/pulpitum-wire-never.csv").exists());
    assert_eq!(count(&c, "SELECT count(*) FROM chat").await, 10);
}

fn first_value(rows: &[SimpleQueryMessage]) -> String {
    rows.iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(r.get(0).unwrap_or("").to_string()),
            _ => None,
        })
        .expect("a row")
}

/// A client's SET changes its own session only; DataFusion's settings cannot be set
/// however they are spelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_changes_only_its_own_session() {
    let s = serve(with_users()).await;
    let a = connect(&s, "carol").await;
    a.simple_query("SET TIME ZONE 'America/New_York'")
        .await
        .unwrap();
    let here = first_value(
        &a.simple_query("SELECT CAST(now() AS VARCHAR)")
            .await
            .unwrap(),
    );
    assert!(here.contains("-05:00") || here.contains("-04:00"), "{here}");
    let b = connect(&s, "carol").await;
    let there = first_value(
        &b.simple_query("SELECT CAST(now() AS VARCHAR)")
            .await
            .unwrap(),
    );
    assert!(
        !there.contains("-05:00") && !there.contains("-04:00"),
        "{there}"
    );
    assert_eq!(
        first_value(&b.simple_query("SHOW timezone").await.unwrap()),
        "UTC"
    );
    for sql in [
        "SET \"datafusion\".execution.batch_size = 1",
        "SET datafusion.execution.target_partitions = 1",
        "SET \"DATAFUSION\".\"EXECUTION\".\"TIME_ZONE\" = '+05:00'",
        "RESET datafusion.execution.batch_size",
        "SET work_mem = '64MB'",
    ] {
        let e = a.simple_query(sql).await.expect_err(sql);
        assert!(code(&e).starts_with("42501"), "{sql}: {}", code(&e));
        let e = a.query(sql, &[]).await.expect_err(sql);
        assert!(
            code(&e).starts_with("42501"),
            "{sql} (extended): {}",
            code(&e)
        );
    }
    let e = a
        .simple_query("SET timezone = 'Mars/Olympus'")
        .await
        .expect_err("bad zone");
    assert!(code(&e).starts_with("22023"), "{}", code(&e));
    // b's batches are DataFusion's default size: a thousand rows come in one go, unaltered
    // by a's attempts.
    let n = count(&b, "SELECT count(*) FROM generate_series(1, 1000)").await;
    assert_eq!(n, 1000);
    a.simple_query("RESET ALL").await.unwrap();
    let back = first_value(&a.simple_query("SHOW timezone").await.unwrap());
    assert_eq!(back, "UTC");

    // A prepared statement (cached per connection) sees the clock and the time zone of each
    // execution: the cache once folded `now()` at its first execution and kept its zone.
    let now = "SELECT CAST(now() AS VARCHAR)";
    let first: String = a.query_one(now, &[]).await.unwrap().get(0);
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let second: String = a.query_one(now, &[]).await.unwrap().get(0);
    assert_ne!(first, second, "now() frozen by the prepared cache");
    assert!(
        !second.contains("-05:00") && !second.contains("-04:00"),
        "{second}"
    );
    a.simple_query("SET TIME ZONE 'America/New_York'")
        .await
        .unwrap();
    let zoned: String = a.query_one(now, &[]).await.unwrap().get(0);
    assert!(
        zoned.contains("-05:00") || zoned.contains("-04:00"),
        "{zoned}"
    );
}

/// A write the client was told did not happen did not happen: an INSERT stopped by its
/// statement timeout while the store writes its rows rolls back (the store's blocking call
/// once committed them after the client had its 57014).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_stopped_by_its_timeout_leaves_nothing() {
    write_stopped_by_its_timeout(false).await;
}

/// The same through the extended protocol, whose statement runs off the runtime's workers:
/// the deadline must be watched there, not only by the caller, which cannot look until the
/// hand-off returns (review finding: the write ran to its end and answered success after
/// the timeout had passed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extended_write_stopped_by_its_timeout_leaves_nothing() {
    write_stopped_by_its_timeout(true).await;
}

async fn write_stopped_by_its_timeout(extended: bool) {
    let s = serve(with_users()).await;
    let c = connect(&s, "bob").await;
    // How long the write takes depends on the machine: shorter timeouts until one stops it
    // (each attempt writes its own channel, so a write that completed is told apart).
    let mut stopped = None;
    for (ch, ms) in [(7, 300), (8, 150), (9, 80), (10, 40), (11, 20), (12, 10)] {
        c.simple_query(&format!("SET statement_timeout = '{ms}ms'"))
            .await
            .unwrap();
        let insert = format!(
            "INSERT INTO chat SELECT {ch}, TIMESTAMP '2026-01-01T00:00:00Z', value, 'x' \
             FROM generate_series(1, 49000)"
        );
        let r = if extended {
            c.execute(&insert, &[]).await.map(|_| ())
        } else {
            c.simple_query(&insert).await.map(|_| ())
        };
        c.simple_query("RESET statement_timeout").await.unwrap();
        if let Err(e) = r {
            assert!(code(&e).starts_with("57014"), "{}", code(&e));
            stopped = Some(ch);
            break;
        }
    }
    let ch = stopped.expect("no timeout stopped the write");
    // Long enough for the abandoned write to have finished, had it gone on.
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(
        count(
            &c,
            &format!("SELECT count(*) FROM chat WHERE channel_id = {ch}")
        )
        .await,
        0
    );
}

/// A query over its memory share fails with 53200 naming the limit; another connection
/// runs meanwhile, and the same connection runs the next statement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_over_its_memory_share_fails_alone() {
    let s = serve(ServerConfig {
        memory_limit: 256 << 20,
        query_memory_limit: 16 << 20,
        ..with_users()
    })
    .await;
    let heavy = connect(&s, "carol").await;
    let other = connect(&s, "carol").await;
    let big = "SELECT count(*) FROM generate_series(1, 3000000) a \
               JOIN generate_series(1, 3000000) b ON a.value = b.value";
    let running = tokio::spawn(async move {
        let r = heavy.simple_query(big).await.map(|_| ());
        (heavy, r)
    });
    assert_eq!(count(&other, "SELECT count(*) FROM chat").await, 10);
    let (heavy, r) = running.await.unwrap();
    let e = r.expect_err("over the limit");
    assert!(code(&e).starts_with("53200"), "{}", code(&e));
    assert!(code(&e).contains("--query-memory-limit"), "{}", code(&e));
    assert_eq!(count(&heavy, "SELECT count(*) FROM chat").await, 10);
}

/// A panic in the engine, while a statement is planned or while its rows are produced, on
/// either protocol, fails that statement with XX000 and nothing else: the connection runs
/// its next statement, and the server's connection slots are all free again afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_the_engine_fails_the_statement_not_the_connection() {
    let s = serve(ServerConfig {
        max_connections: 1,
        ..with_users()
    })
    .await;
    {
        let c = connect(&s, "carol").await;
        for sql in [
            "SELECT boom(1)",
            "SELECT boom(value) FROM generate_series(1, 3)",
        ] {
            let e = c.simple_query(sql).await.expect_err(sql);
            assert!(code(&e).starts_with("XX000"), "{sql}: {}", code(&e));
            let e = c.query(sql, &[]).await.expect_err(sql);
            assert!(code(&e).starts_with("XX000"), "{sql}: {}", code(&e));
            assert_eq!(count(&c, "SELECT count(*) FROM chat").await, 10, "{sql}");
        }
        let e = c
            .query(
                "SELECT boom(value) FROM generate_series(1, $1::BIGINT)",
                &[&5i64],
            )
            .await
            .expect_err("bound");
        assert!(code(&e).starts_with("XX000"), "{}", code(&e));
        assert_eq!(count(&c, "SELECT count(*) FROM chat").await, 10);
        // A panic in a task DataFusion spawned (the aggregate's repartitioned input) is
        // answered the same way, its message kept from the client.
        let e = c
            .simple_query("SELECT boom(value), count(*) FROM generate_series(1, 100000) GROUP BY 1")
            .await
            .expect_err("spawned");
        assert!(code(&e).starts_with("XX000"), "{}", code(&e));
        assert!(!code(&e).contains("secret"), "{}", code(&e));
        // A portal whose rows were streaming when the panic came is finished: executed
        // again, it does not start over from its first row.
        let mut c = c;
        let t = c.transaction().await.unwrap();
        let portal = t
            .bind(
                // Far from the first rows: the engine reads ahead of a suspended portal (in
                // parallel partitions), never a million rows ahead.
                "SELECT boom_at(value - 1000000) + 1000000 FROM generate_series(1, 2000000)",
                &[],
            )
            .await
            .unwrap();
        let first = t.query_portal(&portal, 10).await.unwrap();
        assert_eq!(first.len(), 10);
        let e = t.query_portal(&portal, 0).await.expect_err("the panic");
        assert!(code(&e).starts_with("XX000"), "{}", code(&e));
        let again = t.query_portal(&portal, 10).await;
        assert!(
            again.as_ref().map_or(true, |rows| rows.is_empty()),
            "the portal ran again: {:?} rows",
            again.map(|r| r.len())
        );
        drop(t);
        assert_eq!(count(&c, "SELECT count(*) FROM chat").await, 10);
    }
    // The only slot is free once that client has gone.
    let again = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match tokio_postgres::connect(
                &format!(
                    "host=127.0.0.1 port={} user=carol password='{PASSWORD}' dbname=pulpitum \
                     sslmode=disable",
                    s.port
                ),
                NoTls,
            )
            .await
            {
                Ok((client, conn)) => {
                    tokio::spawn(conn);
                    return client;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    })
    .await
    .expect("the slot is given back");
    assert_eq!(count(&again, "SELECT count(*) FROM chat").await, 10);
}

/// Rows reach the client while the query is still producing them: the first thousand of an
/// effectively endless result arrive long before the statement timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_stream_to_the_client() {
    use futures::StreamExt;
    let s = serve(ServerConfig {
        statement_timeout: Some(Duration::from_secs(60)),
        ..with_users()
    })
    .await;
    let c = connect(&s, "carol").await;
    let rows = c
        .query_raw(
            "SELECT value FROM generate_series(1, 100000000000)",
            Vec::<i64>::new(),
        )
        .await
        .unwrap();
    let mut rows = Box::pin(rows);
    let first = tokio::time::timeout(Duration::from_secs(20), async {
        let mut n = 0;
        while let Some(r) = rows.next().await {
            r.unwrap();
            n += 1;
            if n == 1000 {
                break;
            }
        }
        n
    })
    .await
    .expect("the first rows arrive while the query runs");
    assert_eq!(first, 1000);
    drop(rows);
    drop(c);
    let d = connect(&s, "carol").await;
    assert_eq!(count(&d, "SELECT count(*) FROM chat").await, 10);
}

/// Statements deep enough to overflow a thread's stack, or to plan for ever, are refused
/// before they are parsed (54001); statements just under the limits run; the server lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_too_deep_or_too_costly_to_plan_are_refused() {
    let s = serve(with_users()).await;
    let c = connect(&s, "carol").await;
    let chain = |n: usize| format!("SELECT {}", vec!["1"; n].join("+"));
    let unions = |n: usize| vec!["SELECT 1"; n].join(" UNION ALL ");
    let nested = |n: usize| format!("SELECT {}1{}", "coalesce(".repeat(n), ")".repeat(n));
    // Keyword operators nest as deep as symbols: each of these aborted the server before
    // they were counted (a tester's finding).
    let keywords = |each: &str, n: usize| format!("SELECT 1{}", each.repeat(n));
    let nbsp = format!(
        "WITH t(k) AS (SELECT true) SELECT k{} FROM t",
        "\u{a0}and\u{a0}k".repeat(100_000)
    );
    for sql in [
        chain(5_000),
        unions(2_000),
        nested(40),
        keywords(" IS NULL", 8_000),
        keywords(" IS TRUE", 20_000),
        keywords(" LIKE 'a'", 20_000),
        keywords(" AT TIME ZONE 'UTC'", 20_000),
        keywords(" IN (1)", 20_000),
    ] {
        for extended in [false, true] {
            let e = if extended {
                c.query(sql.as_str(), &[])
                    .await
                    .map(|_| ())
                    .expect_err("refused")
            } else {
                c.simple_query(&sql).await.map(|_| ()).expect_err("refused")
            };
            assert!(
                code(&e).starts_with("54001: statement too complex"),
                "{}",
                code(&e)
            );
        }
    }
    just_under_the_limits(&c).await;
    // U+00A0 is part of an identifier to PostgreSQL's tokenizer and whitespace to
    // DataFusion's generic one: the prepared path once re-parsed the text with the latter,
    // so the extended protocol answered `k AND k` (and a 100,000-term one overflowed the
    // stack) where the simple protocol answered the column named by the whole word.
    let word = "k\u{a0}and\u{a0}k";
    let differ = format!("WITH t(k, \"{word}\") AS (SELECT true, false) SELECT {word} FROM t");
    assert_eq!(first_value(&c.simple_query(&differ).await.unwrap()), "f");
    let v: bool = c.query_one(&differ, &[]).await.unwrap().get(0);
    assert!(
        !v,
        "the extended protocol read another statement than the simple one"
    );
    c.query(&nbsp, &[]).await.expect_err("no such column");
    c.simple_query(&nbsp).await.expect_err("no such column");
    assert_eq!(PANICS.load(Ordering::SeqCst), 0);
    assert_eq!(
        count(&connect(&s, "alice").await, "SELECT count(*) FROM chat").await,
        10
    );
}

/// Statements just under the shape limits, planned and answered on the threads that run
/// the server's connections (each needs most of [`pulpitum::server::CONNECTION_STACK_BYTES`]).
async fn just_under_the_limits(c: &Client) {
    let chain = |n: usize| format!("SELECT {}", vec!["1"; n].join("+"));
    let unions = |n: usize| vec!["SELECT 1"; n].join(" UNION ALL ");
    let nested = |n: usize| format!("SELECT {}1{}", "coalesce(".repeat(n), ")".repeat(n));
    let n: i64 = c.query_one(&chain(900), &[]).await.unwrap().get(0);
    assert_eq!(n, 900);
    let rows = c.simple_query(&unions(400)).await.unwrap();
    assert_eq!(
        rows.iter()
            .filter(|m| matches!(m, SimpleQueryMessage::Row(_)))
            .count(),
        400
    );
    let n: i64 = c.query_one(&nested(16), &[]).await.unwrap().get(0);
    assert_eq!(n, 1);
    // Just under the depth limit (each term is one operator, or two for IS NOT).
    for (each, n) in [
        (" IS NULL", 990),
        (" IN (true)", 990),
        (" IS NOT TRUE", 495),
    ] {
        let sql = format!("SELECT true{}", each.repeat(n));
        c.query(&sql, &[]).await.unwrap();
        c.simple_query(&sql).await.unwrap();
    }
}

/// `ConnectionRuntime::Caller` on a runtime built as the `pulpitum` binary builds its own
/// (`server::runtime_builder`): the deepest statements the shape limits let through are
/// planned on the caller's threads without overflowing their stacks. (A runtime with
/// tokio's default 2 MiB stacks aborts this test.)
#[test]
fn the_callers_runtime_built_for_the_server_runs_the_deepest_statements() {
    pulpitum::server::runtime_builder()
        .build()
        .unwrap()
        .block_on(async {
            let s = serve(ServerConfig {
                runtime: pulpitum::server::ConnectionRuntime::Caller,
                ..with_users()
            })
            .await;
            let c = connect(&s, "carol").await;
            just_under_the_limits(&c).await;
            assert_eq!(PANICS.load(Ordering::SeqCst), 0);
            s.stop.cancel();
        });
}

/// Statements that plan for seconds on as many connections as the runtime has workers, on
/// the simple and then the extended protocol, do not hold up the rest of the runtime: a new
/// client logs in and is answered while every one of them is still planning, whether the
/// connections run on the server's own runtime or on the caller's (`pulpitum serve`'s).
#[test]
fn statements_that_plan_slowly_do_not_hold_up_other_clients() {
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get().max(2));
    for runtime in [
        pulpitum::server::ConnectionRuntime::Own,
        pulpitum::server::ConnectionRuntime::Caller,
    ] {
        pulpitum::server::runtime_builder()
            .worker_threads(workers)
            .build()
            .unwrap()
            .block_on(async {
                let _one_at_a_time = SLOW_PLAN_USER.lock().await;
                let s = serve(ServerConfig {
                    runtime,
                    ..with_users()
                })
                .await;
                for extended in [false, true] {
                    let before = SLOW_FINISHED.load(Ordering::SeqCst);
                    let started = SLOW_STARTED.load(Ordering::SeqCst);
                    let mut slow = Vec::new();
                    for _ in 0..workers {
                        let c = connect(&s, "carol").await;
                        slow.push(tokio::spawn(async move {
                            let r = if extended {
                                c.query("SELECT slow_plan(1)", &[]).await.map(|_| ())
                            } else {
                                c.simple_query("SELECT slow_plan(1)").await.map(|_| ())
                            };
                            r.map_err(|e| code(&e))
                        }));
                    }
                    // Every one of them is planning (blocking its thread) from here.
                    while SLOW_STARTED.load(Ordering::SeqCst) < started + workers {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    let c = connect(&s, "bob").await;
                    assert_eq!(count(&c, "SELECT count(*) FROM chat").await, 10);
                    assert_eq!(
                        SLOW_FINISHED.load(Ordering::SeqCst),
                        before,
                        "{runtime:?}, extended {extended}: the new client was answered only \
                         after a slow statement had been planned"
                    );
                    for t in slow {
                        t.await.unwrap().unwrap();
                    }
                }
                s.stop.cancel();
            });
    }
}

/// A client that sends several statements in one Query and never reads their rows holds
/// no thread the server cannot take back: the server stops within its grace period, and a
/// new client is served meanwhile (the rows of a statement before the last were once sent
/// from a thread handed off for planning, which a shutdown could not abort).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_does_not_read_cannot_hold_the_server() {
    let mut s = serve(ServerConfig {
        shutdown_grace: Duration::from_secs(1),
        statement_timeout: None,
        ..with_users()
    })
    .await;
    let mut sockets = Vec::new();
    for _ in 0..3 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let mut stream = socket
            .connect(([127, 0, 0, 1], s.port).into())
            .await
            .unwrap();
        rawpg::login(&mut stream, "carol", PASSWORD).await.unwrap();
        stream
            .write_all(&rawpg::query(
                "SELECT value, repeat('x', 100) FROM generate_series(1, 100000000); SELECT 1",
            ))
            .await
            .unwrap();
        sockets.push(stream);
    }
    // Their answers fill the sockets; none is read.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let c = connect(&s, "bob").await;
    assert_eq!(count(&c, "SELECT count(*) FROM chat").await, 10);
    s.stop.cancel();
    tokio::time::timeout(Duration::from_secs(20), &mut s.run)
        .await
        .expect("the server stops though its clients do not read")
        .unwrap();
    drop(sockets);
}

/// A cursor's query runs the plan that was judged (a text re-parsed by another dialect
/// created a table), FETCH streams, and a FETCH's count leaves the rest in the cursor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursors_run_the_judged_plan_and_stream() {
    let s = serve(with_users()).await;
    let c = connect(&s, "carol").await;
    for space in ['\u{a0}', '\u{3000}', '\u{2003}', '\u{85}'] {
        let sql = format!("DECLARE c CURSOR FOR SELECT 'pwned' AS x{space}INTO{space}squat");
        let _ = c.simple_query(&sql).await;
        let _ = c.query(sql.as_str(), &[]).await;
        let _ = c.simple_query("CLOSE ALL").await;
    }
    let e = c
        .simple_query("SELECT * FROM squat")
        .await
        .expect_err("no table");
    assert!(code(&e).starts_with("42P01"), "{}", code(&e));
    let e = c
        .simple_query("DECLARE d CURSOR FOR SELECT 1 INTO squat2")
        .await
        .expect_err("refused");
    assert!(code(&e).starts_with("42501"), "{}", code(&e));

    // FETCH n, then FETCH n again, continues where it stopped.
    c.simple_query("DECLARE k CURSOR FOR SELECT value FROM generate_series(1, 10)")
        .await
        .unwrap();
    let values = |m: Vec<SimpleQueryMessage>| -> Vec<String> {
        m.iter()
            .filter_map(|m| match m {
                SimpleQueryMessage::Row(r) => Some(r.get(0).unwrap().to_string()),
                _ => None,
            })
            .collect()
    };
    assert_eq!(
        values(c.simple_query("FETCH 3 FROM k").await.unwrap()),
        ["1", "2", "3"]
    );
    assert_eq!(
        values(c.simple_query("FETCH 2 FROM k").await.unwrap()),
        ["4", "5"]
    );
    assert_eq!(
        values(c.simple_query("FETCH ALL FROM k").await.unwrap()).len(),
        5
    );
    assert!(values(c.simple_query("FETCH ALL FROM k").await.unwrap()).is_empty());

    // FETCH ALL of an endless cursor: rows arrive while it runs.
    let mut sock = raw(&s).await;
    rawpg::login(&mut sock, "carol", PASSWORD).await.unwrap();
    sock.write_all(&rawpg::query(
        "DECLARE e CURSOR FOR SELECT value FROM generate_series(1, 100000000000)",
    ))
    .await
    .unwrap();
    rawpg::until_ready(&mut sock, Duration::from_secs(10)).await;
    sock.write_all(&rawpg::query("FETCH ALL FROM e"))
        .await
        .unwrap();
    let first = tokio::time::timeout(Duration::from_secs(20), async {
        let mut rows = 0;
        while rows < 1000 {
            let m = rawpg::read(&mut sock, Duration::from_secs(20))
                .await
                .expect("a row");
            rows += usize::from(m.kind == b'D');
        }
        rows
    })
    .await
    .expect("the first rows of FETCH ALL arrive while it runs");
    assert_eq!(first, 1000);
}

/// Before a login, no frame larger than an authentication message is buffered: a header
/// declaring a large Query is refused at once, its body never awaited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_frames_before_a_login_are_refused_at_their_header() {
    let s = serve(with_users()).await;
    let mut sock = raw(&s).await;
    let mut header = vec![b'Q'];
    header.extend_from_slice(&(1_000_000i32).to_be_bytes());
    sock.write_all(&[rawpg::startup("alice"), header].concat())
        .await
        .unwrap();
    let (msgs, closed) = read_all(&mut sock, Duration::from_secs(5)).await;
    assert!(closed, "closed without the body: {msgs:?}");
    let e = msgs.iter().find_map(Msg::error).expect("refused");
    assert!(e.2.contains("Query declares 1000000 bytes"), "{e:?}");
}

/// Bound values arrow-pg would decode past their end, or convert with an overflow or to a
/// silent NULL, are refused with the parameter named; the connection carries on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_or_out_of_range_parameters_are_refused() {
    let s = serve(with_users()).await;
    let mut sock = raw(&s).await;
    rawpg::login(&mut sock, "carol", PASSWORD).await.unwrap();
    let short_interval: &[u8] = &[0, 0, 1];
    let huge_interval: &[u8] = &[[0x7f; 8], [0; 8]].concat();
    for (sql, oid, value, want) in [
        (
            "SELECT CAST($1 AS interval)",
            1186u32,
            short_interval,
            "22P03",
        ),
        ("SELECT CAST($1 AS interval)", 1186, huge_interval, "22008"),
        ("SELECT $1 + 1", 20, &[1, 2, 3][..], "22P03"),
        (
            "SELECT count(*) FROM chat WHERE timestamp < $1",
            20,
            &i64::MAX.to_be_bytes()[..],
            "22008",
        ),
    ] {
        sock.write_all(&rawpg::extended_binary(sql, &[oid], &[Some(value)]))
            .await
            .unwrap();
        let msgs = rawpg::until_ready(&mut sock, Duration::from_secs(10)).await;
        let e = msgs.iter().find_map(Msg::error).expect("refused");
        assert_eq!(e.1, want, "{sql}: {e:?}");
        assert_eq!(e.0, "ERROR");
    }
    // A timestamp beyond a nanosecond's range compares exactly (the column is in
    // microseconds), neither NULL nor wrapped.
    let c = connect(&s, "carol").await;
    let far: chrono::DateTime<chrono::Utc> = "2500-01-01T00:00:00Z".parse().unwrap();
    let n: i64 = c
        .query_one("SELECT count(*) FROM chat WHERE timestamp < $1", &[&far])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 10);
    // Against a nanosecond timestamp it cannot be represented: refused, not NULL (a NULL
    // would match nothing and answer 0).
    let e = c
        .query(
            "SELECT count(*) FROM (SELECT CAST('2020-01-01' AS TIMESTAMP) AS t) AS x WHERE t < $1",
            &[&far.naive_utc()],
        )
        .await
        .expect_err("out of range");
    assert!(code(&e).starts_with("22008"), "{}", code(&e));
    assert_eq!(PANICS.load(Ordering::SeqCst), 0);
    // The raw connection still answers.
    sock.write_all(&rawpg::query("SELECT 1")).await.unwrap();
    let msgs = rawpg::until_ready(&mut sock, Duration::from_secs(5)).await;
    assert!(msgs.iter().any(|m| m.kind == b'D'), "{msgs:?}");
}

/// Smaller protocol matters: one statement per Parse, SHOW of what is not a setting,
/// savepoints, and process ids that differ between connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_statement_per_parse_show_savepoints_and_process_ids() {
    let s = serve(with_users()).await;
    let c = connect(&s, "bob").await;
    let e = c
        .query(
            "SELECT 1; INSERT INTO chat VALUES (5, TIMESTAMP '2026-01-01T00:00:00Z', 1, 'x')",
            &[],
        )
        .await
        .expect_err("two statements");
    assert!(code(&e).starts_with("42601"), "{}", code(&e));
    assert_eq!(
        count(&c, "SELECT count(*) FROM chat WHERE channel_id = 5").await,
        0
    );
    // Several statements in one Query message: a refusal of any is decided before any runs,
    // and the first error ends the message (the INSERTs below must not commit).
    let insert = "INSERT INTO chat VALUES (6, TIMESTAMP '2026-01-01T00:00:00Z', 1, 'x')";
    for (text, state) in [
        (format!("{insert}; CREATE TABLE zz AS SELECT 1"), "42501"),
        (format!("{insert}; SELECT 1 INTO squat"), "42501"),
        (format!("SELECT 1 / (id - id) FROM chat; {insert}"), ""),
    ] {
        let e = c.simple_query(&text).await.expect_err(&text);
        assert!(code(&e).starts_with(state), "{text}: {}", code(&e));
        assert_eq!(
            count(&c, "SELECT count(*) FROM chat WHERE channel_id = 6").await,
            0,
            "{text}"
        );
    }
    let carol = connect(&s, "carol").await;
    let e = carol
        .simple_query(&format!("SELECT 1; {insert}"))
        .await
        .expect_err("read role");
    assert!(code(&e).starts_with("42501"), "{}", code(&e));
    // What succeeds answers every statement, in order.
    let all = c
        .simple_query(&format!(
            "SELECT 7; {insert}; SELECT count(*) FROM chat WHERE channel_id = 6"
        ))
        .await
        .unwrap();
    let values: Vec<String> = all
        .iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(r.get(0).unwrap().to_string()),
            SimpleQueryMessage::CommandComplete(n) => Some(format!("tag {n}")),
            _ => None,
        })
        .collect();
    assert_eq!(values, ["7", "tag 1", "tag 1", "1", "tag 1"]);
    for extended in [false, true] {
        let all = if extended {
            c.query("SHOW ALL", &[]).await.unwrap().len()
        } else {
            c.simple_query("SHOW ALL")
                .await
                .unwrap()
                .iter()
                .filter(|m| matches!(m, SimpleQueryMessage::Row(_)))
                .count()
        };
        assert_eq!(all, pulpitum::server::vars::ALLOWED.len());
        let e = if extended {
            c.query("SHOW datafusion.execution.batch_size", &[])
                .await
                .map(|_| ())
        } else {
            c.simple_query("SHOW datafusion.execution.batch_size")
                .await
                .map(|_| ())
        }
        .expect_err("not a setting");
        assert!(code(&e).starts_with("42704"), "{}", code(&e));
    }
    let e = c
        .simple_query("ROLLBACK TO SAVEPOINT a")
        .await
        .expect_err("no savepoints");
    assert!(code(&e).starts_with("0A000"), "{}", code(&e));
    let mut pids = Vec::new();
    for _ in 0..3 {
        let mut sock = raw(&s).await;
        pids.push(rawpg::login(&mut sock, "carol", PASSWORD).await.unwrap());
    }
    pids.sort();
    pids.dedup();
    assert_eq!(pids.len(), 3, "each connection its own process id");

    // Without passwords (loopback, `insecure_no_auth`) the start takes another handler; its
    // process ids come from the same server-wide generator.
    let open = serve(ServerConfig {
        insecure_no_auth: true,
        ..ServerConfig::default()
    })
    .await;
    let mut pids = Vec::new();
    for _ in 0..3 {
        let mut sock = raw(&open).await;
        sock.write_all(&rawpg::startup("anyone")).await.unwrap();
        let msgs = rawpg::until_ready(&mut sock, Duration::from_secs(5)).await;
        let key = msgs
            .iter()
            .find(|m| m.kind == b'K')
            .expect("BackendKeyData");
        pids.push(i32::from_be_bytes(key.body[..4].try_into().unwrap()));
    }
    pids.sort();
    pids.dedup();
    assert_eq!(
        pids.len(),
        3,
        "open server: each connection its own process id"
    );
}

/// A connection from `local` (any loopback address: 127.0.0.0/8 is all loopback on Linux)
/// to the server, so one test can play clients at different addresses.
async fn raw_from(s: &Served, local: &str) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{local}:0").parse().unwrap()).unwrap();
    socket
        .connect(([127, 0, 0, 1], s.port).into())
        .await
        .unwrap()
}

/// Issue 25 (third round), A: connections that sent a StartupMessage and then nothing hold
/// no connection slot; from one address they are bounded (a quarter of the start bound)
/// and cannot keep a real user out. The limit still applies to logins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_logins_from_one_address_cannot_take_the_slots() {
    let s = serve(ServerConfig {
        max_connections: 2,
        ..with_users()
    })
    .await;
    let mut silent = Vec::new();
    let mut asked_password = 0;
    for _ in 0..24 {
        let mut sock = raw_from(&s, "127.0.0.2").await;
        sock.write_all(&rawpg::startup("alice")).await.unwrap();
        if let Some(m) = rawpg::read(&mut sock, Duration::from_millis(500)).await {
            if m.auth_code() == Some(10) {
                asked_password += 1;
            }
        }
        silent.push(sock);
    }
    let alice = connect(&s, "alice").await;
    assert_eq!(count(&alice, "SELECT count(*) FROM chat").await, 10);
    let carol = connect(&s, "carol").await;
    assert_eq!(count(&carol, "SELECT count(*) FROM chat").await, 10);
    // 64 starts in all for this server, 16 per address, until their login.
    assert_eq!(asked_password, 16, "one address's share of the starts");
    // Both slots are logged in: the next login is refused, before its password.
    let info = format!(
        "host=127.0.0.1 port={} user=bob password='{PASSWORD}' dbname=pulpitum sslmode=disable",
        s.port
    );
    let e = tokio_postgres::connect(&info, NoTls)
        .await
        .err()
        .expect("the server is full");
    assert!(code(&e).starts_with("53300"), "{}", code(&e));
    drop(silent);
}

/// Issue 25 (third round), B: StartupMessage parameters go through the rules of SET; a bad
/// value or an unknown name refuses the connection, what is taken applies to the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_parameters_follow_the_rules_of_set() {
    let s = serve(with_users()).await;
    for (name, value, want) in [
        ("client_encoding", "LATIN1", "22023"),
        ("extra_float_digits", "-128", "22023"),
        ("intervalstyle", "nonsense", "22023"),
        ("bytea_output", "nonsense", "22023"),
        ("DateStyle", "nonsense", "22023"),
        ("statement_timeout_ms", "99999999", "42704"),
        ("datafusion.execution.batch_size", "1", "42704"),
        ("options", "-c intervalstyle=nonsense", "22023"),
    ] {
        let (got, message) = refused_in_one_write(
            &s,
            &rawpg::startup_with("alice", &[(name, value)]),
            &format!("{name}={value}"),
        )
        .await;
        assert_eq!(got, want, "{name}={value}: {message}");
        let shown = name.to_ascii_lowercase();
        let shown = shown.trim_start_matches("options");
        assert!(message.contains(shown), "{name}={value}: {message}");
    }
    // What JDBC sends, taken; the values reach the session and its login report.
    let mut sock = raw(&s).await;
    sock.write_all(&rawpg::startup_with(
        "alice",
        &[
            ("client_encoding", "UTF8"),
            ("DateStyle", "ISO"),
            ("TimeZone", "America/New_York"),
            ("extra_float_digits", "3"),
            ("IntervalStyle", "iso_8601"),
        ],
    ))
    .await
    .unwrap();
    let m = rawpg::read(&mut sock, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(m.auth_code(), Some(10), "{m:?}");
    drop(sock);
    let (c, conn) = tokio_postgres::connect(
        &format!(
            "host=127.0.0.1 port={} user=alice password='{PASSWORD}' dbname=pulpitum \
             sslmode=disable options='-c TimeZone=America/New_York -c intervalstyle=iso_8601 \
             -c bytea_output=escape'",
            s.port
        ),
        NoTls,
    )
    .await
    .unwrap_or_else(|e| panic!("{}", code(&e)));
    tokio::spawn(conn);
    let rows = c
        .simple_query("SHOW timezone; SELECT interval '1 day' AS i; SELECT 'ab'::bytea")
        .await
        .unwrap();
    let values: Vec<String> = rows
        .iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
            _ => None,
        })
        .collect();
    assert_eq!(values, ["America/New_York", "P1D", "ab"], "{values:?}");
}

/// Issue 25 (third round), C: a connection keeps at most 1,000 prepared statements and
/// portals, and at most its budget of their text (here `--max-message-bytes`, 1 MiB); a
/// Parse past either is refused with 54000, and Close releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_statements_a_connection_keeps_are_bounded() {
    let s = serve(ServerConfig {
        max_message_bytes: 1 << 20,
        ..with_users()
    })
    .await;
    let mut sock = raw(&s).await;
    rawpg::login(&mut sock, "carol", PASSWORD).await.unwrap();
    let big = format!("SELECT '{}' AS filler", "x".repeat(300_000));
    let answers = |msgs: &[Msg]| -> Vec<String> {
        msgs.iter()
            .filter(|m| m.kind != b'Z')
            .map(|m| match m.error() {
                Some(e) => e.1,
                None => (m.kind as char).to_string(),
            })
            .collect()
    };
    let mut sent = Vec::new();
    for name in ["a", "b", "c", "d"] {
        sent.extend(rawpg::parse(name, &big));
        sent.extend(rawpg::sync());
    }
    sock.write_all(&sent).await.unwrap();
    let mut got = Vec::new();
    for _ in 0..4 {
        got.extend(answers(
            &rawpg::until_ready(&mut sock, Duration::from_secs(10)).await,
        ));
    }
    assert_eq!(
        got,
        ["1", "1", "1", "54000"],
        "three fit in 1 MiB, not four"
    );
    let sent = [
        rawpg::close_statement("a"),
        rawpg::parse("d", &big),
        rawpg::sync(),
    ]
    .concat();
    sock.write_all(&sent).await.unwrap();
    let got = answers(&rawpg::until_ready(&mut sock, Duration::from_secs(10)).await);
    assert_eq!(got, ["3", "1"], "Close releases");

    let mut sock = raw(&s).await;
    rawpg::login(&mut sock, "carol", PASSWORD).await.unwrap();
    let mut sent = Vec::new();
    for i in 0..=1_000 {
        sent.extend(rawpg::parse(&format!("s{i}"), "SELECT 1"));
    }
    sent.extend(rawpg::sync());
    sock.write_all(&sent).await.unwrap();
    let got = answers(&rawpg::until_ready(&mut sock, Duration::from_secs(60)).await);
    assert_eq!(
        got.len(),
        1_001,
        "{:?}",
        &got[got.len().saturating_sub(3)..]
    );
    assert!(got[..1_000].iter().all(|a| a == "1"));
    assert_eq!(got[1_000], "54000");
    // Still usable once below the limit.
    sock.write_all(&[rawpg::close_statement("s0"), rawpg::extended("SELECT 7")].concat())
        .await
        .unwrap();
    let msgs = rawpg::until_ready(&mut sock, Duration::from_secs(10)).await;
    assert!(msgs.iter().all(|m| m.error().is_none()), "{msgs:?}");
    assert!(msgs.iter().any(|m| m.kind == b'D'), "{msgs:?}");
}

/// The commit gate reaches the store through a SQL statement's execution (DataFusion runs
/// the table's sink on the statement's task): an INSERT and a DELETE run inside a statement
/// abandoned before they commit change nothing, and the same statements in a fresh one do.
/// This is what makes a wire timeout that comes first roll the write back, and one that
/// comes during the commit wait for it (`server::limits::bounded`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_of_an_abandoned_statement_commit_nothing_through_sql() {
    use pulpitum::store::gate::{within, CommitGate};

    let s = serve(with_users()).await;
    let dir = tempfile::tempdir().unwrap();
    let archive = Arc::new(
        pulpitum::archive::ArchiveStore::from_url(&format!(
            "file://{}",
            dir.path().join("archive").display()
        ))
        .unwrap(),
    );
    let ctx = session(s.store.clone(), archive, SessionOptions::default())
        .await
        .unwrap();
    let run = |sql: &'static str, gate: Arc<CommitGate>| {
        let ctx = ctx.clone();
        async move {
            within(gate, async move {
                ctx.sql(sql).await?.collect().await.map(|_| ())
            })
            .await
        }
    };
    let count = |sql: &'static str| {
        let ctx = ctx.clone();
        async move {
            let b = ctx.sql(sql).await.unwrap().collect().await.unwrap();
            b[0].column(0)
                .as_any()
                .downcast_ref::<datafusion::arrow::array::Int64Array>()
                .unwrap()
                .value(0)
        }
    };
    let insert = "INSERT INTO chat VALUES (77, TIMESTAMP '2026-01-01T00:00:00Z', 1, 'x')";
    let delete = "DELETE FROM chat WHERE channel_id = 1";
    let abandoned = || {
        let g = CommitGate::new();
        assert!(g.abandon());
        g
    };
    assert!(run(insert, abandoned()).await.is_err());
    assert!(run(delete, abandoned()).await.is_err());
    assert_eq!(
        count("SELECT count(*) FROM chat WHERE channel_id = 77").await,
        0
    );
    assert_eq!(
        count("SELECT count(*) FROM chat WHERE channel_id = 1").await,
        10
    );
    run(insert, CommitGate::new()).await.unwrap();
    run(delete, CommitGate::new()).await.unwrap();
    assert_eq!(
        count("SELECT count(*) FROM chat WHERE channel_id = 77").await,
        1
    );
    assert_eq!(
        count("SELECT count(*) FROM chat WHERE channel_id = 1").await,
        0
    );
}

/// Several statements in one Query are bounded one at a time: an INSERT that committed does
/// not exempt a later statement from the timeout (its own answer, `INSERT 0 1`, was sent,
/// and the rows are there); and `EXPLAIN ANALYZE` of a write, whose input would run outside
/// the statement's commit gate, is refused and writes nothing (break-it findings).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_write_does_not_lift_the_timeout_of_the_statements_after_it() {
    let s = serve(with_users()).await;
    let c = connect(&s, "bob").await;
    c.simple_query("SET statement_timeout = '300ms'")
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let r = c
        .simple_query(
            "INSERT INTO chat VALUES (41, TIMESTAMP '2026-01-01T00:00:00Z', 1, 'kept'); \
             SELECT count(*) FROM generate_series(1, 300000000); SELECT 1",
        )
        .await;
    let took = started.elapsed();
    let e = r.expect_err("the long statement ran past the timeout");
    assert!(code(&e).starts_with("57014"), "{}", code(&e));
    // Unbounded, the count runs to its end (9.4 s here) before the last statement's 57014.
    assert!(took < Duration::from_secs(4), "stopped only after {took:?}");
    c.simple_query("RESET statement_timeout").await.unwrap();
    assert_eq!(
        count(&c, "SELECT count(*) FROM chat WHERE channel_id = 41").await,
        1
    );

    let e = c
        .simple_query(
            "EXPLAIN ANALYZE INSERT INTO chat VALUES (42, TIMESTAMP '2026-01-01T00:00:00Z', 1, 'x')",
        )
        .await
        .expect_err("EXPLAIN ANALYZE of a write ran");
    assert!(code(&e).starts_with("0A000"), "{}", code(&e));
    assert_eq!(
        count(&c, "SELECT count(*) FROM chat WHERE channel_id = 42").await,
        0
    );
}

/// A connection to the PostgreSQL the answers are compared with.
async fn postgres() -> Client {
    let (pg, conn) =
        tokio_postgres::connect("host=127.0.0.1 port=5432 user=postgres dbname=test", NoTls)
            .await
            .expect("PostgreSQL on 127.0.0.1:5432");
    tokio::spawn(conn);
    pg
}

/// The column of rows in `messages`, as text.
fn column(messages: &[SimpleQueryMessage]) -> Vec<String> {
    messages
        .iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(r.get(0).unwrap_or("NULL").to_string()),
            _ => None,
        })
        .collect()
}

/// Timestamps sent as text are what PostgreSQL sends, in the session's time zone with its
/// offsets (minutes kept: `+05:30`, not `+05`), on every path that sends rows: a query run
/// as its shape (planned, then from the cache), several statements in one Query, a
/// cursor. And the session's format options reach the shapes (issue 25's review: they
/// were answered with the defaults whatever the session had set).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timestamps_and_styles_are_written_as_the_session_set_them() {
    let s = serve(with_users()).await;
    let c = connect(&s, "carol").await;
    let pg = postgres().await;
    // The instants of channel 1 (`serve`), written by PostgreSQL itself.
    let theirs =
        "SELECT (TIMESTAMPTZ '2026-01-01 00:00:00+00' + (i % 9) * INTERVAL '1 day')::text \
                  FROM generate_series(1, 10) AS i ORDER BY i";
    let ours = "SELECT timestamp FROM chat WHERE channel_id = 1 ORDER BY id";
    for zone in [
        "Asia/Kolkata",
        "America/St_Johns",
        "Asia/Kathmandu",
        "UTC",
        "Europe/Berlin",
    ] {
        let set = format!("SET TimeZone = '{zone}'");
        c.simple_query(&set).await.unwrap();
        pg.simple_query(&set).await.unwrap();
        let want = column(&pg.simple_query(theirs).await.unwrap());
        assert_eq!(want.len(), 10);
        let several = format!("SELECT 1; {ours}");
        let cursor = format!("DECLARE t CURSOR FOR {ours}; FETCH ALL FROM t; CLOSE t");
        for (path, sql) in [
            ("shape, planned", ours),
            ("shape, cached", ours),
            ("several statements", several.as_str()),
            ("cursor", cursor.as_str()),
        ] {
            let got: Vec<String> = column(&c.simple_query(sql).await.unwrap())
                .into_iter()
                .filter(|v| v != "1")
                .collect();
            assert_eq!(got, want, "{zone}, {path}");
        }
    }
    c.simple_query("RESET TimeZone").await.unwrap();

    // The session's styles reach a query run as its shape, planned and cached.
    c.simple_query("SET IntervalStyle = 'iso_8601'")
        .await
        .unwrap();
    c.simple_query("SET DateStyle = 'German'").await.unwrap();
    for _ in 0..2 {
        let i = column(
            &c.simple_query("SELECT INTERVAL '1 day' AS i FROM chat WHERE id = 1")
                .await
                .unwrap(),
        );
        assert_eq!(i, ["P1D"]);
        let t = column(
            &c.simple_query("SELECT timestamp FROM chat WHERE id = 1")
                .await
                .unwrap(),
        );
        assert!(t[0].starts_with("02.01.2026 00:00:00"), "{t:?}");
    }
}

/// A string naming a time without an offset is read in the session's time zone, as
/// PostgreSQL reads it (a JDBC client sends its machine's zone at login); one with an
/// offset keeps its instant. Compared with PostgreSQL over the same instants, through a
/// query run as its shape (planned, then cached), several statements in one Query, and a
/// prepared statement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strings_compared_with_times_are_read_in_the_session_zone() {
    let s = serve(with_users()).await;
    let c = connect(&s, "carol").await;
    let pg = postgres().await;
    let mut differing = 0;
    for zone in [
        "America/New_York",
        "Asia/Kolkata",
        "UTC",
        "Pacific/Kiritimati",
    ] {
        let set = format!("SET TimeZone = '{zone}'");
        c.simple_query(&set).await.unwrap();
        pg.simple_query(&set).await.unwrap();
        for at in [
            "2026-01-05",
            "2026-01-04 23:30:00",
            "2026-01-05 03:00:00",
            "2026-01-05T00:00:00Z",
            "2026-01-05 05:00:00+05:30",
        ] {
            // The instants of channel 1 (`serve`), on PostgreSQL.
            let theirs = format!(
                "SELECT count(*) FROM generate_series(1, 10) AS i \
                 WHERE TIMESTAMPTZ '2026-01-01 00:00:00+00' + (i % 9) * INTERVAL '1 day' >= '{at}'"
            );
            let want = column(&pg.simple_query(&theirs).await.unwrap());
            let ours = format!("SELECT count(*) FROM chat WHERE timestamp >= '{at}'");
            let several = format!("SELECT 1 WHERE false; {ours}");
            for (path, sql) in [
                ("shape, planned", ours.as_str()),
                ("shape, cached", ours.as_str()),
                ("several statements", several.as_str()),
            ] {
                let got = column(&c.simple_query(sql).await.unwrap());
                assert_eq!(got, want, "{zone}, {at}, {path}");
            }
            let prepared: i64 = c.query_one(ours.as_str(), &[]).await.unwrap().get(0);
            assert_eq!(prepared.to_string(), want[0], "{zone}, {at}, prepared");
            let utc = column(
                &pg.simple_query(&format!("SET TimeZone = 'UTC'; {theirs}; {set}"))
                    .await
                    .unwrap(),
            );
            differing += usize::from(utc != want);
        }
    }
    // Zones west and east of UTC each change some of the answers.
    assert!(differing >= 4, "{differing}");

    // A `timestamptz` parameter sent as text, without an offset, is read in the zone too
    // (pgwire reads it in UTC).
    for (zone, at) in [
        ("America/New_York", "2026-01-05 00:00:00"),
        ("Asia/Kolkata", "2026-01-05 03:00:00"),
        ("America/New_York", "2026-01-05 00:00:00+00"),
    ] {
        let set = format!("SET TimeZone = '{zone}'");
        pg.simple_query(&set).await.unwrap();
        let want = column(
            &pg.simple_query(&format!(
                "SELECT count(*) FROM generate_series(1, 10) AS i \
                 WHERE TIMESTAMPTZ '2026-01-01 00:00:00+00' + (i % 9) * INTERVAL '1 day' >= '{at}'"
            ))
            .await
            .unwrap(),
        );
        let mut sock = raw(&s).await;
        rawpg::login(&mut sock, "carol", PASSWORD).await.unwrap();
        sock.write_all(&rawpg::query(&set)).await.unwrap();
        rawpg::until_ready(&mut sock, Duration::from_secs(5)).await;
        const TIMESTAMPTZ: u32 = 1184;
        sock.write_all(&rawpg::extended_text(
            "SELECT count(*) FROM chat WHERE timestamp >= $1",
            &[TIMESTAMPTZ],
            &[Some(at.as_bytes())],
        ))
        .await
        .unwrap();
        let answer = rawpg::until_ready(&mut sock, Duration::from_secs(5)).await;
        let row = answer
            .iter()
            .find(|m| m.kind == b'D')
            .unwrap_or_else(|| panic!("{zone}, {at}: {answer:?}"));
        // One column: its length, then its text.
        let got = String::from_utf8(row.body[6..].to_vec()).unwrap();
        assert_eq!(vec![got], want, "{zone}, {at}, a text parameter");
    }
}

/// The text of the first column of the first row among `answer`'s messages.
fn first_text(answer: &[Msg], what: &str) -> String {
    let row = answer
        .iter()
        .find(|m| m.kind == b'D')
        .unwrap_or_else(|| panic!("{what}: {answer:?}"));
    let len = i32::from_be_bytes([row.body[2], row.body[3], row.body[4], row.body[5]]);
    String::from_utf8(row.body[6..6 + len as usize].to_vec()).unwrap()
}

/// A `LIMIT` or `OFFSET` parameter sent without a type is a `bigint`, as PostgreSQL types
/// it, in text and in binary (it was left untyped, read as text, and failed with `XX000`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untyped_limit_parameters_are_bigints() {
    let s = serve(with_users()).await;
    let mut sock = raw(&s).await;
    rawpg::login(&mut sock, "alice", PASSWORD).await.unwrap();
    let wait = Duration::from_secs(5);
    let sql = "SELECT id FROM chat WHERE channel_id = 1 ORDER BY id LIMIT $1 OFFSET $2";
    let want = {
        let c = connect(&s, "alice").await;
        let rows = c
            .query(sql, &[&2i64, &1i64])
            .await
            .expect("described as bigints, bound as bigints");
        assert_eq!(rows.len(), 2);
        rows.iter().map(|r| r.get::<_, i64>(0)).collect::<Vec<_>>()
    };
    for (message, how) in [
        (
            rawpg::extended_text(sql, &[0, 0], &[Some(b"2"), Some(b"1")]),
            "text",
        ),
        (
            rawpg::extended_binary(
                sql,
                &[0, 0],
                &[Some(&2i64.to_be_bytes()), Some(&1i64.to_be_bytes())],
            ),
            "binary",
        ),
    ] {
        sock.write_all(&message).await.unwrap();
        let answer = rawpg::until_ready(&mut sock, wait).await;
        assert!(
            answer.iter().all(|m| m.error().is_none()),
            "{how}: {answer:?}"
        );
        let rows: Vec<&rawpg::Msg> = answer.iter().filter(|m| m.kind == b'D').collect();
        assert_eq!(rows.len(), want.len(), "{how}: {answer:?}");
    }
    // The same parameter as a limit and in a comparison (break-it findings): typed by the
    // comparison, as PostgreSQL types it, and its limit still a constant once bound.
    let c = connect(&s, "alice").await;
    let ids =
        |rows: Vec<tokio_postgres::Row>| -> Vec<i64> { rows.iter().map(|r| r.get(0)).collect() };
    let all = ids(c
        .query("SELECT id FROM chat WHERE channel_id = 1 ORDER BY id", &[])
        .await
        .unwrap());
    for n in [1i64, 2, 3] {
        let got = ids(c
            .query(
                "SELECT id FROM chat WHERE channel_id = 1 AND id >= $1 ORDER BY id LIMIT $1",
                &[&n],
            )
            .await
            .unwrap_or_else(|e| panic!("LIMIT $1 used twice: {e}")));
        let want: Vec<i64> = all
            .iter()
            .copied()
            .filter(|i| *i >= n)
            .take(n as usize)
            .collect();
        assert_eq!(got, want, "n = {n}");
    }
    let small: Vec<i32> = c
        .query(
            "SELECT a FROM (VALUES (CAST(1 AS INT)), (CAST(2 AS INT)), (CAST(3 AS INT))) t(a) \
             WHERE a >= $1 ORDER BY a LIMIT $1",
            &[&2i32],
        )
        .await
        .unwrap_or_else(|e| panic!("an int parameter as a limit: {e}"))
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(small, vec![2, 3]);
    // A negative limit or offset: PostgreSQL's codes, not an internal error.
    for (sql, want) in [
        ("SELECT id FROM chat LIMIT $1", "2201W"),
        ("SELECT id FROM chat OFFSET $1", "2201X"),
    ] {
        let e = c.query(sql, &[&-1i64]).await.expect_err(sql);
        assert!(code(&e).starts_with(want), "{sql}: {}", code(&e));
    }
}

/// What a break-it review found on the first version of the session zone: a string cast in
/// the select list (once an internal error, its column's name changed), statements off the
/// prepared path of the extended protocol (`LIMIT $1`, a row change), `INSERT ... SELECT`
/// of a string, a binary `timestamp` parameter: each reads and writes times in the
/// session's zone, as PostgreSQL does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_path_reads_and_writes_times_in_the_session_zone() {
    let s = serve(with_users()).await;
    let c = connect(&s, "alice").await;
    let pg = postgres().await;
    let instants =
        "SELECT TIMESTAMPTZ '2026-01-01 00:00:00+00' + (i % 9) * INTERVAL '1 day' AS t, \
                    i AS id FROM generate_series(1, 10) AS i";
    for zone in ["UTC", "America/New_York"] {
        let set = format!("SET TimeZone = '{zone}'");
        c.simple_query(&set).await.unwrap();
        pg.simple_query(&set).await.unwrap();
        // Local times the clock skips or shows twice, read as PostgreSQL reads them (a
        // break-it finding: arrow's cast refused them).
        if zone != "UTC" {
            for (ours, theirs) in [
                (
                    "SELECT '2026-03-08 02:30:00'::timestamptz".to_string(),
                    "SELECT '2026-03-08 02:30:00'::timestamptz".to_string(),
                ),
                (
                    "SELECT count(*) FROM chat WHERE timestamp > '2026-11-01 01:30:00'::timestamptz"
                        .to_string(),
                    format!(
                        "SELECT count(*) FROM ({instants}) x \
                         WHERE t > '2026-11-01 01:30:00'::timestamptz"
                    ),
                ),
            ] {
                let want = column(&pg.simple_query(&theirs).await.unwrap());
                let got = column(&c.simple_query(&ours).await.unwrap());
                assert_eq!(got, want, "{zone}: {ours}");
            }
        }
        // With no zone set (UTC), DataFusion's `timestamptz` has no zone and is written
        // without an offset: an older difference (docs/sql.md), left out here.
        if zone != "UTC" {
            let cast = "SELECT '2026-01-05 00:00:00'::timestamptz";
            let want = column(&pg.simple_query(cast).await.unwrap());
            let got = column(&c.simple_query(cast).await.unwrap());
            assert_eq!(got, want, "{zone}: {cast}");
        }
        for (ours, theirs) in [
            (
                "SELECT CASE WHEN id = 1 THEN timestamp ELSE '2026-01-05 00:00:00' END \
                 FROM chat WHERE id = 2"
                    .to_string(),
                format!(
                    "SELECT CASE WHEN id = 1 THEN t ELSE '2026-01-05 00:00:00' END \
                     FROM ({instants}) x WHERE id = 2"
                ),
            ),
            (
                "SELECT sum(CASE WHEN timestamp >= '2026-01-05 00:00:00' THEN 1 ELSE 0 END) \
                 FROM chat"
                    .to_string(),
                format!(
                    "SELECT sum(CASE WHEN t >= '2026-01-05 00:00:00' THEN 1 ELSE 0 END) \
                     FROM ({instants}) x"
                ),
            ),
            (
                "SELECT timestamp >= '2026-01-05 00:00:00' FROM chat WHERE id = 4".to_string(),
                format!("SELECT t >= '2026-01-05 00:00:00' FROM ({instants}) x WHERE id = 4"),
            ),
        ] {
            let want = column(&pg.simple_query(&theirs).await.unwrap());
            let got = column(&c.simple_query(&ours).await.unwrap());
            assert_eq!(got, want, "{zone}: {ours}");
        }
    }

    // Off the prepared path of the extended protocol: a `LIMIT $1` query's rows, and a
    // timestamptz parameter sent as text.
    let mut sock = raw(&s).await;
    rawpg::login(&mut sock, "alice", PASSWORD).await.unwrap();
    let wait = Duration::from_secs(5);
    sock.write_all(&rawpg::query("SET TimeZone = 'America/New_York'"))
        .await
        .unwrap();
    rawpg::until_ready(&mut sock, wait).await;
    const INT8: u32 = 20;
    const TIMESTAMP: u32 = 1114;
    const TIMESTAMPTZ: u32 = 1184;
    sock.write_all(&rawpg::extended_text(
        "SELECT timestamp FROM chat WHERE id = 1 LIMIT $1",
        &[INT8],
        &[Some(b"5")],
    ))
    .await
    .unwrap();
    let got = first_text(&rawpg::until_ready(&mut sock, wait).await, "LIMIT $1");
    assert_eq!(got, "2026-01-01 19:00:00-05");
    sock.write_all(&rawpg::extended_text(
        "SELECT $1::timestamptz AS t",
        &[TIMESTAMPTZ],
        &[Some(b"2026-01-05 00:00:00")],
    ))
    .await
    .unwrap();
    let got = first_text(
        &rawpg::until_ready(&mut sock, wait).await,
        "$1::timestamptz",
    );
    assert_eq!(got, "2026-01-05 00:00:00-05");

    // A parameter the plan leaves untyped (`$1::int`), sent in binary with no type: decoded
    // from its use, as before (a break-it finding read its bytes as text).
    sock.write_all(&rawpg::extended_binary(
        "SELECT count(*) FROM chat WHERE id = $1::int",
        &[0],
        &[Some(&3i32.to_be_bytes())],
    ))
    .await
    .unwrap();
    let got = first_text(&rawpg::until_ready(&mut sock, wait).await, "$1::int");
    assert_eq!(got, "1");

    // A binary `timestamp` (without a zone) compared with the column: a local time.
    let local = chrono::NaiveDate::from_ymd_opt(2026, 1, 4)
        .unwrap()
        .and_hms_opt(20, 0, 0)
        .unwrap();
    let epoch = chrono::NaiveDate::from_ymd_opt(2000, 1, 1)
        .unwrap()
        .and_hms_opt(0, 0, 0)
        .unwrap();
    let micros = (local - epoch).num_microseconds().unwrap();
    sock.write_all(&rawpg::extended_binary(
        "SELECT count(*) FROM chat WHERE timestamp >= $1 AND channel_id = 1",
        &[TIMESTAMP],
        &[Some(&micros.to_be_bytes())],
    ))
    .await
    .unwrap();
    let got = first_text(
        &rawpg::until_ready(&mut sock, wait).await,
        "binary timestamp",
    );
    let want = column(
        &pg.simple_query(&format!(
            "SET TimeZone = 'America/New_York'; \
             SELECT count(*) FROM ({instants}) x WHERE t >= TIMESTAMP '2026-01-04 20:00:00'"
        ))
        .await
        .unwrap(),
    );
    assert_eq!(vec![got], want, "a binary timestamp parameter");

    // Writes: a string of an INSERT ... SELECT, and a text parameter of an INSERT (with and
    // without its type), are stored as the local times they name.
    c.simple_query("SET TimeZone = 'America/New_York'")
        .await
        .unwrap();
    c.simple_query("INSERT INTO chat SELECT 2, '2026-02-01 00:00:00', 103, 'z'")
        .await
        .unwrap();
    for (id, oid) in [(200, TIMESTAMPTZ), (201, 0)] {
        sock.write_all(&rawpg::extended_text(
            &format!("INSERT INTO chat VALUES (3, $1, {id}, 'p')"),
            &[oid],
            &[Some(b"2026-02-01 00:00:00")],
        ))
        .await
        .unwrap();
        let answer = rawpg::until_ready(&mut sock, wait).await;
        assert!(answer.iter().all(|m| m.kind != b'E'), "{id}: {answer:?}");
    }
    let stored = count(
        &c,
        "SELECT count(*) FROM chat WHERE channel_id IN (2, 3) \
         AND timestamp = '2026-02-01T05:00:00Z'",
    )
    .await;
    assert_eq!(stored, 3);
}

/// A subquery in the select list that refers to the outer query or to a parameter, which the
/// server's SQL parser replaces by NULL (for psql's catalog queries), is refused with 0A000
/// rather than answered NULL; an uncorrelated one is answered, and psql's catalog queries
/// keep working (`server::psql_meta_commands_queries_and_errors`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subquery_the_parser_would_drop_is_refused_not_answered_null() {
    let s = serve(with_users()).await;
    let c = connect(&s, "carol").await;
    for sql in [
        "SELECT id, (SELECT max(c2.id) FROM chat c2 WHERE c2.id < c.id) FROM chat c WHERE id = 3",
        "SELECT id, (SELECT count(*) FROM chat c2 WHERE c2.id < c.id) AS n FROM chat c",
        "SELECT 1; SELECT (SELECT max(c2.id) FROM chat c2 WHERE c2.id < c.id) FROM chat c",
    ] {
        let e = c.simple_query(sql).await.expect_err(sql);
        assert!(code(&e).starts_with("0A000"), "{sql}: {}", code(&e));
    }
    let e = c
        .query(
            "SELECT (SELECT max(id) FROM chat WHERE id < $1) AS m",
            &[&5i64],
        )
        .await
        .expect_err("a parameter in a select-list subquery");
    assert!(code(&e).starts_with("0A000"), "{}", code(&e));
    let n = count(&c, "SELECT (SELECT count(*) FROM chat) AS n").await;
    assert_eq!(n, 10);
}

//! Archive stores from URLs: `file:///abs/path`, `s3://bucket/prefix`, `memory://[prefix]`.
//!
//! S3 settings come from the usual AWS variables: `AWS_ENDPOINT_URL` (or `AWS_ENDPOINT`),
//! `AWS_REGION` (or `AWS_DEFAULT_REGION`, default `us-east-1`), `AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`. With an explicit endpoint (MinIO, radosgw,
//! Ceph) requests use path-style addressing, which OpenDAL does unless virtual hosts are
//! enabled. S3 operators retry transient errors with jittered backoff; a retried conditional
//! create that finds its own object is resolved by the write path's content comparison.
//!
//! Every S3 call has a deadline, so an endpoint that accepts a connection and then stops
//! answering cannot hang a worker or a query: `PULPITUM_S3_TIMEOUT_SECONDS` (default 60)
//! bounds each control call (stat, delete, ...), `PULPITUM_S3_IO_TIMEOUT_SECONDS` (default
//! 30) each read, write or list call and each step of their bodies. A call that times out
//! is retried like any transient error, each attempt with its own deadline.

use std::time::Duration;

use opendal::layers::{RetryLayer, TimeoutLayer};
use opendal::services::{Fs, Memory, S3};
use opendal::Operator;

use super::{ArchiveError, ArchiveStore};

/// Installs, once per process, the HTTP transport OpenDAL's S3 service sends requests with
/// (reqwest) and the rustls crypto provider it needs (ring). Idempotent; called by
/// [`ArchiveStore::from_url`] for `s3://` and by anything that builds an S3 operator itself.
pub fn install_http_transport() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Another component may have installed a provider first; either one serves.
        let _ = rustls::crypto::ring::default_provider().install_default();
        opendal::init_default_registry();
        opendal_http_transport_reqwest::install_default();
    });
}

/// Default deadline of one S3 control call (stat, delete, ...).
pub const S3_TIMEOUT: Duration = Duration::from_secs(60);
/// Default deadline of one S3 read, write or list call, and of each step of its body.
pub const S3_IO_TIMEOUT: Duration = Duration::from_secs(30);

/// The S3 timeouts from the environment (`env` looks a variable up), with their defaults.
fn s3_timeouts(env: impl Fn(&str) -> Option<String>) -> Result<(Duration, Duration), ArchiveError> {
    let read = |name: &str, default: Duration| -> Result<Duration, ArchiveError> {
        let Some(raw) = env(name).filter(|v| !v.trim().is_empty()) else {
            return Ok(default);
        };
        raw.trim()
            .parse::<f64>()
            .ok()
            .filter(|v| *v > 0.0)
            .and_then(|v| Duration::try_from_secs_f64(v).ok())
            .ok_or_else(|| {
                ArchiveError::Config(format!(
                    "{name}={raw:?}: expected a positive number of seconds"
                ))
            })
    };
    Ok((
        read("PULPITUM_S3_TIMEOUT_SECONDS", S3_TIMEOUT)?,
        read("PULPITUM_S3_IO_TIMEOUT_SECONDS", S3_IO_TIMEOUT)?,
    ))
}

impl ArchiveStore {
    /// Like [`ArchiveStore::from_url`], with the S3 settings looked up by `lookup` instead
    /// of in the process environment (one process talking to two endpoints, tests).
    pub fn from_url_with_env(
        url: &str,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ArchiveError> {
        store_from_url_with(url, lookup)
    }
}

/// The refusal of a bare path given as an archive URL, with the URL it probably meant: the
/// folder as a `file://` URL with an absolute path. Nothing is guessed from a string that
/// could hold a secret (an `@` or an `=`).
fn path_hint(raw: &str) -> String {
    let t = raw.trim();
    if t.is_empty() || t.contains('@') || t.contains('=') {
        return "not a URL; accepted: s3://bucket/prefix, file:///absolute/path or memory://"
            .into();
    }
    let abs = if t.starts_with('/') {
        Some(std::path::PathBuf::from(t))
    } else {
        let rest = t.trim_start_matches("./");
        std::env::current_dir().ok().map(|d| d.join(rest))
    };
    match abs {
        Some(p) => format!(
            "a path is not a URL; for a local folder write file://{} (file:// and an absolute path)",
            p.display()
        ),
        None => "a path is not a URL; for a local folder write file:// and an absolute path".into(),
    }
}

pub(crate) fn store_from_url(raw: &str) -> Result<ArchiveStore, ArchiveError> {
    store_from_url_with(raw, |n| std::env::var(n).ok())
}

fn store_from_url_with(
    raw: &str,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<ArchiveStore, ArchiveError> {
    let env = |names: &[&str]| {
        names
            .iter()
            .find_map(|n| lookup(n).filter(|v| !v.is_empty()))
    };
    let bad = |reason: String| {
        ArchiveError::Config(format!(
            "archive URL {:?}: {reason}",
            crate::locator::redact(raw)
        ))
    };
    let url = url::Url::parse(raw).map_err(|e| match e {
        url::ParseError::RelativeUrlWithoutBase => bad(path_hint(raw)),
        e => bad(e.to_string()),
    })?;
    let config = |e: opendal::Error| bad(e.to_string());
    // Object keys carry the prefix, and the registry tells a segment's key from a bucket's
    // own by a `segments` directory in it (`store::SEGMENT_KEY_LIKE`): under a prefix with
    // one, a bucket's own objects could be taken for segments (left out of compaction's
    // work and of a listing across partitions). Refused rather than guessed around.
    if matches!(url.scheme(), "s3" | "memory") {
        let prefix = format!("{}{}", url.host_str().unwrap_or(""), url.path());
        let inside = if url.scheme() == "s3" {
            url.path()
        } else {
            &prefix
        };
        if inside.split('/').any(|c| c == "segments") {
            return Err(bad(
                "the prefix must not contain a directory named \"segments\": archive keys \
                 use that name for compacted segments (docs/segments.md)"
                    .into(),
            ));
        }
    }
    match url.scheme() {
        "memory" => {
            let prefix = format!("{}{}", url.host_str().unwrap_or(""), url.path());
            let op = Operator::new(Memory::default()).map_err(config)?;
            Ok(ArchiveStore::from_operator(op, &prefix))
        }
        "file" => {
            if url
                .host_str()
                .is_some_and(|h| !h.is_empty() && h != "localhost")
            {
                // file://tmp/x reads "tmp" as a host: the path it meant needs three slashes.
                let host = url.host_str().unwrap_or("");
                return Err(bad(format!(
                    "file URLs must not name a host (this one names {host:?}); for the folder \
                     /{host}{} write file:///{host}{}",
                    url.path(),
                    url.path()
                )));
            }
            let path = url
                .to_file_path()
                .map_err(|()| bad("not an absolute file path".into()))?;
            let root = path
                .to_str()
                .ok_or_else(|| bad("path is not UTF-8".into()))?;
            // Archived rows are the application's data: a new archive folder is owner-only.
            crate::locator::create_private_dir(&path)
                .map_err(|e| bad(format!("cannot create the folder: {e}")))?;
            let op = Operator::new(Fs::default().root(root)).map_err(config)?;
            Ok(ArchiveStore::from_operator(op, ""))
        }
        "s3" => {
            let bucket = url
                .host_str()
                .filter(|h| !h.is_empty())
                .ok_or_else(|| bad("missing bucket (s3://bucket/prefix)".into()))?;
            // Credentials come from the AWS variables only: a URL is printed, logged and
            // stored in shell history, so one carrying a key is refused rather than used.
            if !url.username().is_empty() || url.password().is_some() || url.query().is_some() {
                return Err(bad(
                    "an s3:// URL takes no user, password or query parameters; set AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN instead".into(),
                ));
            }
            install_http_transport();
            let mut b = S3::default().bucket(bucket).root("/").region(
                &env(&["AWS_REGION", "AWS_DEFAULT_REGION"]).unwrap_or_else(|| "us-east-1".into()),
            );
            if let Some(ep) = env(&["AWS_ENDPOINT_URL", "AWS_ENDPOINT"]) {
                b = b.endpoint(&ep);
            }
            if let Some(k) = env(&["AWS_ACCESS_KEY_ID"]) {
                b = b.access_key_id(&k);
            }
            if let Some(s) = env(&["AWS_SECRET_ACCESS_KEY"]) {
                b = b.secret_access_key(&s);
            }
            if let Some(t) = env(&["AWS_SESSION_TOKEN"]) {
                b = b.session_token(&t);
            }
            let (timeout, io_timeout) = s3_timeouts(&lookup)?;
            // The timeout goes inside the retry layer: each attempt has its own deadline, and
            // a timed-out attempt is retried (OpenDAL's documented order).
            let op = Operator::new(b)
                .map_err(config)?
                .layer(
                    TimeoutLayer::new()
                        .with_timeout(timeout)
                        .with_io_timeout(io_timeout),
                )
                .layer(RetryLayer::new().with_jitter().with_max_times(4));
            Ok(ArchiveStore::from_operator(op, url.path()))
        }
        other => Err(bad(format!(
            "unknown scheme {other:?} (expected file, s3 or memory)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes() {
        assert_eq!(store_from_url("memory://").unwrap().prefix(), "");
        assert_eq!(store_from_url("memory://a/b/").unwrap().prefix(), "a/b");
        let dir = tempfile::tempdir().unwrap();
        let u = format!("file://{}", dir.path().display());
        assert_eq!(store_from_url(&u).unwrap().prefix(), "");
        assert_eq!(
            store_from_url("s3://bkt/some/prefix").unwrap().prefix(),
            "some/prefix"
        );
        for bad in [
            "gcs://x",
            "not a url",
            "archive",
            "./archive",
            "s3:///nobucket",
            "file://host/x",
            "s3://AKIA:s3cr3t@bkt/p",
            "s3://bkt/p?secret_access_key=s3cr3t",
            "s3://bkt/x/segments/eu/stores-global",
            "s3://bkt/segments",
            "memory://segments/a",
        ] {
            let err = match store_from_url(bad) {
                Err(ArchiveError::Config(e)) => e,
                other => panic!("{bad}: {:?}", other.map(|s| s.prefix().to_string())),
            };
            assert!(!err.contains("s3cr3t"), "{err}");
        }
        // A bucket named like the directory is not a prefix; a name containing it is fine.
        assert!(store_from_url("s3://segments/p").is_ok());
        assert!(store_from_url("s3://bkt/my-segments/p").is_ok());
        let err = store_from_url("s3://bkt/a/segments/b")
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("directory named \"segments\""), "{err}");
        let err = store_from_url("file://tmp/x").err().unwrap().to_string();
        assert!(err.contains("write file:///tmp/x"), "{err}");
        let err = store_from_url("/tmp/relative").err().unwrap().to_string();
        assert!(err.contains("write file:///tmp/relative"), "{err}");
        let err = store_from_url("./archive").err().unwrap().to_string();
        let here = std::env::current_dir().unwrap().join("archive");
        assert!(err.contains(&format!("file://{}", here.display())), "{err}");
    }

    #[test]
    fn s3_timeouts_have_defaults_and_refuse_bad_values() {
        assert_eq!(s3_timeouts(|_| None).unwrap(), (S3_TIMEOUT, S3_IO_TIMEOUT));
        let set =
            |name: &'static str, v: &'static str| move |n: &str| (n == name).then(|| v.to_string());
        assert_eq!(
            s3_timeouts(set("PULPITUM_S3_IO_TIMEOUT_SECONDS", "2.5")).unwrap(),
            (S3_TIMEOUT, Duration::from_millis(2500))
        );
        for bad in ["0", "-1", "abc", "1e30", "NaN", "inf"] {
            let err = s3_timeouts(set("PULPITUM_S3_TIMEOUT_SECONDS", bad))
                .unwrap_err()
                .to_string();
            assert!(err.contains("PULPITUM_S3_TIMEOUT_SECONDS"), "{bad}: {err}");
        }
    }
}

//! Crash and pause fail points for the archiver's recovery tests.
//!
//! With the `failpoints` feature, `hit("name")` acts when the environment variable
//! `PULPITUM_FAILPOINT` names it: `name` aborts the process (as `kill -9` would: no
//! destructors, no flushes, no goodbye to the database) and `name:stop` sends the process
//! SIGSTOP (once per process), so a test can freeze a worker past its lease and resume it. Without the feature
//! `hit` compiles to nothing, so production builds carry no trap door.

/// Every fail point the archiver defines, in protocol order: archival, cleanup, then the
/// compaction of the archived window.
pub const ALL: &[&str] = &[
    "after_claim",
    "mid_snapshot",
    "mid_upload",
    "after_upload",
    "after_verify",
    "after_publish",
    "mid_cleanup",
    "compact_after_claim",
    "segment_after_payload",
    "segment_after_manifest",
    "compact_before_switch",
    "compact_after_switch",
];

/// Acts on the fail point `name` if it is armed.
#[inline]
pub fn hit(name: &str) {
    #[cfg(feature = "failpoints")]
    {
        let Ok(armed) = std::env::var("PULPITUM_FAILPOINT") else {
            return;
        };
        if armed == name {
            eprintln!("pulpitum: fail point {name} reached, aborting");
            std::process::abort();
        }
        static STOPPED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        // A stop fires once per process, so a resumed worker runs on past it.
        if armed.strip_suffix(":stop") == Some(name)
            && !STOPPED.swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            eprintln!("pulpitum: fail point {name} reached, stopping");
            // Freeze like a long GC pause or a suspended VM; a test sends SIGCONT.
            let _ = std::process::Command::new("kill")
                .args(["-STOP", &std::process::id().to_string()])
                .status();
        }
    }
    #[cfg(not(feature = "failpoints"))]
    let _ = name;
}

//! Who may connect: SCRAM-SHA-256 against users configured in a file or the environment.
//!
//! Passwords are salted and hashed once, at start (a random salt per user and process, 4,096
//! iterations as PostgreSQL uses by default), and only the salted form stays in memory; the
//! plain text is dropped. A users file holds one `name:password` per line (`#` starts a
//! comment) and must not be readable by group or others, as PostgreSQL demands of its key
//! files. No password ever appears in an error, a log line or `--help`.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use async_trait::async_trait;
use datafusion_postgres::pgwire::api::auth::sasl::scram::gen_salted_password;
use datafusion_postgres::pgwire::api::auth::{AuthSource, LoginInfo, Password};
use datafusion_postgres::pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use rand::RngCore;

use super::ServerError;

/// SCRAM iterations (PostgreSQL's default).
pub const SCRAM_ITERATIONS: usize = 4096;

/// The users allowed to connect, with their salted passwords.
#[derive(Clone, Default)]
pub struct Users {
    salted: HashMap<String, (Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for Users {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Names only: the salted passwords are secrets too.
        let mut names: Vec<&String> = self.salted.keys().collect();
        names.sort();
        f.debug_struct("Users").field("names", &names).finish()
    }
}

impl Users {
    /// Whether no user is configured.
    pub fn is_empty(&self) -> bool {
        self.salted.is_empty()
    }

    /// Adds a user. Names follow PostgreSQL's role names loosely: non-empty, no `:`, no
    /// whitespace or control characters; passwords are non-empty.
    pub fn add(&mut self, name: &str, password: &str, origin: &str) -> Result<(), ServerError> {
        let bad = |reason: &str| ServerError::Config {
            setting: "users",
            reason: format!("{origin}: {reason}"),
        };
        if name.is_empty()
            || name.contains(':')
            || name.chars().any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(bad(&format!("{name:?} is not a user name")));
        }
        if password.is_empty() {
            return Err(bad(&format!("user {name} has an empty password")));
        }
        if self.salted.contains_key(name) {
            return Err(bad(&format!("user {name} is given twice")));
        }
        let mut salt = vec![0u8; 16];
        rand::rng().fill_bytes(&mut salt);
        let hash = gen_salted_password(password, &salt, SCRAM_ITERATIONS);
        self.salted.insert(name.to_string(), (salt, hash));
        Ok(())
    }

    /// Reads a users file: `name:password` per line, `#` comments and blank lines ignored.
    /// The file must be owner-only (mode 0600 or stricter).
    pub fn from_file(path: &Path) -> Result<Self, ServerError> {
        let shown = path.display().to_string();
        let bad = |reason: String| ServerError::Config {
            setting: "--users-file (PULPITUM_SERVER_USERS_FILE)",
            reason,
        };
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let meta = std::fs::metadata(path).map_err(|e| bad(format!("{shown}: {e}")))?;
            if meta.permissions().mode() & 0o077 != 0 {
                return Err(bad(format!(
                    "{shown} is readable by group or others (mode {:o}); chmod 600 it",
                    meta.permissions().mode() & 0o777
                )));
            }
        }
        let text = std::fs::read_to_string(path).map_err(|e| bad(format!("{shown}: {e}")))?;
        let mut users = Self::default();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            // The line itself is never echoed: it holds a password.
            let (name, password) = line
                .split_once(':')
                .ok_or_else(|| bad(format!("{shown} line {}: expected name:password", n + 1)))?;
            users.add(name.trim(), password, &format!("{shown} line {}", n + 1))?;
        }
        if users.is_empty() {
            return Err(bad(format!("{shown} names no user")));
        }
        Ok(users)
    }
}

#[async_trait]
impl AuthSource for Users {
    async fn get_password(&self, login: &LoginInfo) -> PgWireResult<Password> {
        // An unknown user fails exactly like a wrong password, so names cannot be probed.
        match login.user().and_then(|u| self.salted.get(u)) {
            Some((salt, hash)) => Ok(Password::new(Some(salt.clone()), hash.clone())),
            None => Err(PgWireError::UserError(Box::new(ErrorInfo::new(
                "FATAL".into(),
                "28P01".into(),
                format!(
                    "password authentication failed for user \"{}\"",
                    login.user().unwrap_or("")
                ),
            )))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_files_are_checked_and_never_echo_passwords() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("users");
        std::fs::write(&path, "# team\nalice:s3cret-one\n\nbob: two words \n").unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
            let e = Users::from_file(&path).unwrap_err().to_string();
            assert!(e.contains("chmod 600"), "{e}");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        let users = Users::from_file(&path).unwrap();
        assert_eq!(
            format!("{users:?}"),
            "Users { names: [\"alice\", \"bob\"] }"
        );
        std::fs::write(&path, "alice:s3cret-one\nno-colon-hunter2\n").unwrap();
        let e = Users::from_file(&path).unwrap_err().to_string();
        assert!(e.contains("line 2: expected name:password"), "{e}");
        assert!(!e.contains("hunter2"), "{e}");
        std::fs::write(&path, "alice:x\nalice:y\n").unwrap();
        let e = Users::from_file(&path).unwrap_err().to_string();
        assert!(e.contains("given twice"), "{e}");
        std::fs::write(&path, "al ice:x\n").unwrap();
        assert!(Users::from_file(&path).is_err());
        std::fs::write(&path, "alice:\n").unwrap();
        let e = Users::from_file(&path).unwrap_err().to_string();
        assert!(e.contains("empty password"), "{e}");
    }
}

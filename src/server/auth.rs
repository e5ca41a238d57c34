//! Who may connect, and with which role: SCRAM-SHA-256 against users configured in a file or
//! the environment.
//!
//! Passwords are salted and hashed once, at start (a random salt per user and process, 4,096
//! iterations as PostgreSQL uses by default), and only the salted form stays in memory; the
//! plain text is dropped. A users file holds one `name:password:role` per line (`#` starts a
//! comment line), the role being `read`, `write` or `admin` (see [`super::guard`]). The
//! password is everything between the first and the last `:`, byte for byte: nothing is
//! trimmed. The file must belong to the user the server runs as and be readable by nobody
//! else, as PostgreSQL demands of its key files. No password ever appears in an error, a
//! log line or `--help`.
//!
//! A name that is not configured gets the same SCRAM exchange as one that is: a salt (a
//! deterministic one, derived from the name and a per-process key, so asking twice gives
//! the same answer as it would for a real user) and then the same "password authentication
//! failed" at the end. The exchange does not tell who exists.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use async_trait::async_trait;
use datafusion_postgres::pgwire::api::auth::sasl::scram::gen_salted_password;
use datafusion_postgres::pgwire::api::auth::{AuthSource, LoginInfo, Password};
use datafusion_postgres::pgwire::error::PgWireResult;
use rand::RngCore;
use sha2::{Digest, Sha256};

use super::guard::Role;
use super::ServerError;

/// SCRAM iterations (PostgreSQL's default).
pub const SCRAM_ITERATIONS: usize = 4096;

#[derive(Clone)]
struct User {
    salt: Vec<u8>,
    salted: Vec<u8>,
    role: Role,
}

/// The users allowed to connect, with their salted passwords and roles.
#[derive(Clone)]
pub struct Users {
    users: HashMap<String, User>,
    /// Key of the fake salts given to names that are not configured.
    decoy_key: [u8; 32],
    /// The salted password those names are checked against (matches nothing).
    decoy_salted: Vec<u8>,
}

impl Default for Users {
    fn default() -> Self {
        let mut decoy_key = [0u8; 32];
        rand::rng().fill_bytes(&mut decoy_key);
        let mut decoy_salted = vec![0u8; 32];
        rand::rng().fill_bytes(&mut decoy_salted);
        Self {
            users: HashMap::new(),
            decoy_key,
            decoy_salted,
        }
    }
}

impl fmt::Debug for Users {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Names and roles only: the salted passwords are secrets too.
        let mut names: Vec<String> = self
            .users
            .iter()
            .map(|(n, u)| format!("{n}:{}", u.role))
            .collect();
        names.sort();
        f.debug_struct("Users").field("names", &names).finish()
    }
}

const LINE_FORM: &str = "each line is name:password:role, the role read, write or admin";

impl Users {
    /// Whether no user is configured.
    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }

    /// The role of a configured user.
    pub fn role(&self, name: &str) -> Option<Role> {
        self.users.get(name).map(|u| u.role)
    }

    /// Adds a user. Names follow PostgreSQL's role names loosely: non-empty, no `:`, no
    /// whitespace or control characters; passwords are non-empty and taken exactly.
    pub fn add(
        &mut self,
        name: &str,
        password: &str,
        role: Role,
        origin: &str,
    ) -> Result<(), ServerError> {
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
        if self.users.contains_key(name) {
            return Err(bad(&format!("user {name} is given twice")));
        }
        let mut salt = vec![0u8; 16];
        rand::rng().fill_bytes(&mut salt);
        let salted = gen_salted_password(password, &salt, SCRAM_ITERATIONS);
        self.users
            .insert(name.to_string(), User { salt, salted, role });
        Ok(())
    }

    /// Reads a users file: `name:password:role` per line, `#` comment lines and empty lines
    /// ignored. The file must be owned by the server's user and readable by nobody else.
    pub fn from_file(path: &Path) -> Result<Self, ServerError> {
        let shown = path.display().to_string();
        let bad = |reason: String| ServerError::Config {
            setting: "--users-file (PULPITUM_SERVER_USERS_FILE)",
            reason,
        };
        #[cfg(unix)]
        {
            use std::os::unix::fs::{MetadataExt, PermissionsExt};
            let meta = std::fs::metadata(path).map_err(|e| bad(format!("{shown}: {e}")))?;
            // SAFETY: geteuid has no preconditions and cannot fail.
            let me = unsafe { libc::geteuid() };
            if meta.uid() != me {
                return Err(bad(format!(
                    "{shown} belongs to uid {}, not to the server's user (uid {me}); \
                     chown it to the user the server runs as",
                    meta.uid()
                )));
            }
            if meta.permissions().mode() & 0o077 != 0 {
                return Err(bad(format!(
                    "{shown} is readable by group or others (mode {:o}); chmod 600 it",
                    meta.permissions().mode() & 0o777
                )));
            }
        }
        let text = std::fs::read_to_string(path).map_err(|e| bad(format!("{shown}: {e}")))?;
        let mut users = Self::default();
        for (n, line) in text.split('\n').enumerate() {
            // A file written on Windows ends its lines with \r\n: the \r is the line's end,
            // not the role's last character.
            let line = line.strip_suffix('\r').unwrap_or(line);
            if line.trim().is_empty() || line.starts_with('#') {
                continue;
            }
            let at = format!("{shown} line {}", n + 1);
            // The line itself is never echoed: it holds a password.
            let (name, rest) = line
                .split_once(':')
                .ok_or_else(|| bad(format!("{at}: {LINE_FORM}")))?;
            let (password, role) = rest.rsplit_once(':').ok_or_else(|| {
                bad(format!(
                    "{at}: no role; add one after a last colon (name:password:read, :write or \
                     :admin)"
                ))
            })?;
            let role = Role::parse(role).ok_or_else(|| {
                bad(format!(
                    "{at}: the text after the last ':' is not a role; {LINE_FORM}"
                ))
            })?;
            users.add(name, password, role, &at)?;
        }
        if users.is_empty() {
            return Err(bad(format!("{shown} names no user")));
        }
        Ok(users)
    }

    /// The salt answered for a name that is not configured: the same for the same name, for
    /// the life of the process, like a real user's.
    fn decoy_salt(&self, name: &str) -> Vec<u8> {
        let mut h = Sha256::new();
        h.update(self.decoy_key);
        h.update(name.as_bytes());
        h.finalize()[..16].to_vec()
    }
}

#[async_trait]
impl AuthSource for Users {
    async fn get_password(&self, login: &LoginInfo) -> PgWireResult<Password> {
        let name = login.user().unwrap_or("");
        Ok(match self.users.get(name) {
            Some(u) => Password::new(Some(u.salt.clone()), u.salted.clone()),
            // Fails at the proof, exactly as a wrong password does.
            None => Password::new(Some(self.decoy_salt(name)), self.decoy_salted.clone()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, text: &str) {
        std::fs::write(path, text).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
    }

    #[test]
    fn users_files_are_checked_and_never_echo_passwords() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("users");
        write(
            &path,
            "# team\nalice:s3cret-one:admin\n\nbob: two:words :read\r\n",
        );
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
            "Users { names: [\"alice:admin\", \"bob:read\"] }"
        );
        assert_eq!(users.role("bob"), Some(Role::Read));
        // bob's password is " two:words ", spaces and inner colon kept.
        let bob = &users.users["bob"];
        assert_eq!(
            bob.salted,
            gen_salted_password(" two:words ", &bob.salt, SCRAM_ITERATIONS)
        );
        for (text, needle, secret) in [
            (
                "alice:s3cret-one:admin\nno-colon-hunter2\n",
                "line 2: each line is",
                "hunter2",
            ),
            ("alice:hunter2\n", "line 1: no role; add one", "hunter2"),
            (
                "alice:pass:hunter2\n",
                "line 1: the text after the last ':' is not a role",
                "hunter2",
            ),
            ("alice:x:read\nalice:y:read\n", "given twice", "hunter2"),
            ("al ice:x:read\n", "is not a user name", "hunter2"),
            ("alice::read\n", "empty password", "hunter2"),
            ("alice:hunter2:admin \n", "is not a role", "hunter2"),
            ("# nobody\n", "names no user", "hunter2"),
        ] {
            write(&path, text);
            let e = Users::from_file(&path).unwrap_err().to_string();
            assert!(e.contains(needle), "{text:?}: {e}");
            assert!(!e.contains(secret), "{e}");
        }
    }

    #[tokio::test]
    async fn passwords_are_taken_exactly_and_unknown_names_get_a_stable_salt() {
        let mut users = Users::default();
        users.add("alice", " spaced ", Role::Read, "test").unwrap();
        let real = users
            .get_password(&LoginInfo::new(Some("alice"), None, "127.0.0.1".into()))
            .await
            .unwrap();
        let u = &users.users["alice"];
        assert_eq!(
            real.password(),
            &gen_salted_password(" spaced ", &u.salt, SCRAM_ITERATIONS)[..]
        );
        assert_ne!(
            real.password(),
            &gen_salted_password("spaced", &u.salt, SCRAM_ITERATIONS)[..]
        );
        let ask = |name: &'static str| {
            let users = users.clone();
            async move {
                users
                    .get_password(&LoginInfo::new(Some(name), None, "127.0.0.1".into()))
                    .await
                    .unwrap()
            }
        };
        let (m1, m2, e) = (ask("mallory").await, ask("mallory").await, ask("eve").await);
        assert_eq!(m1.salt(), m2.salt(), "the same name gets the same salt");
        assert_ne!(m1.salt(), e.salt());
        assert_eq!(m1.salt().map(<[u8]>::len), real.salt().map(<[u8]>::len));
    }
}

//! A PostgreSQL frontend that speaks raw bytes, for tests that must send what no driver
//! would: messages out of order, several in one write, truncated or lying about their
//! lengths. It builds frames, reads backend messages, and runs a SCRAM-SHA-256 login by
//! hand (postgres-protocol's client side) so a test can put anything after any step.

#![allow(dead_code)]

use std::time::Duration;

use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A typed frontend frame.
pub fn frame(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut f = vec![kind];
    f.extend_from_slice(&(body.len() as i32 + 4).to_be_bytes());
    f.extend_from_slice(body);
    f
}

fn cstr(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(s.as_bytes());
    out.push(0);
}

/// StartupMessage (protocol 3.0) for `user`.
pub fn startup(user: &str) -> Vec<u8> {
    startup_with(user, &[])
}

/// StartupMessage (protocol 3.0) for `user`, with more parameters.
pub fn startup_with(user: &str, params: &[(&str, &str)]) -> Vec<u8> {
    let mut body = 196_608i32.to_be_bytes().to_vec();
    cstr(&mut body, "user");
    cstr(&mut body, user);
    cstr(&mut body, "database");
    cstr(&mut body, "pulpitum");
    for (k, v) in params {
        cstr(&mut body, k);
        cstr(&mut body, v);
    }
    body.push(0);
    let mut f = ((body.len() + 4) as i32).to_be_bytes().to_vec();
    f.extend_from_slice(&body);
    f
}

/// SSLRequest.
pub fn ssl_request() -> Vec<u8> {
    let mut f = 8i32.to_be_bytes().to_vec();
    f.extend_from_slice(&80_877_103i32.to_be_bytes());
    f
}

/// CancelRequest.
pub fn cancel_request(pid: i32, key: &[u8]) -> Vec<u8> {
    let mut body = 80_877_102i32.to_be_bytes().to_vec();
    body.extend_from_slice(&pid.to_be_bytes());
    body.extend_from_slice(key);
    let mut f = ((body.len() + 4) as i32).to_be_bytes().to_vec();
    f.extend_from_slice(&body);
    f
}

/// Query (simple protocol).
pub fn query(sql: &str) -> Vec<u8> {
    let mut body = Vec::new();
    cstr(&mut body, sql);
    frame(b'Q', &body)
}

/// Parse, Bind, Execute and Sync of `sql` (unnamed statement and portal, no parameters).
pub fn extended(sql: &str) -> Vec<u8> {
    let mut parse = Vec::new();
    cstr(&mut parse, "");
    cstr(&mut parse, sql);
    parse.extend_from_slice(&0i16.to_be_bytes());
    let mut bind = Vec::new();
    cstr(&mut bind, "");
    cstr(&mut bind, "");
    bind.extend_from_slice(&0i16.to_be_bytes());
    bind.extend_from_slice(&0i16.to_be_bytes());
    bind.extend_from_slice(&0i16.to_be_bytes());
    let mut execute = Vec::new();
    cstr(&mut execute, "");
    execute.extend_from_slice(&0i32.to_be_bytes());
    [
        frame(b'P', &parse),
        frame(b'B', &bind),
        frame(b'E', &execute),
        frame(b'S', &[]),
    ]
    .concat()
}

/// Parse of `sql` as the statement `name` (no parameter types).
pub fn parse(name: &str, sql: &str) -> Vec<u8> {
    let mut body = Vec::new();
    cstr(&mut body, name);
    cstr(&mut body, sql);
    body.extend_from_slice(&0i16.to_be_bytes());
    frame(b'P', &body)
}

/// Close of the statement `name`.
pub fn close_statement(name: &str) -> Vec<u8> {
    let mut body = vec![b'S'];
    cstr(&mut body, name);
    frame(b'C', &body)
}

/// Sync.
pub fn sync() -> Vec<u8> {
    frame(b'S', &[])
}

/// SASLInitialResponse naming `mechanism`, with `data`.
pub fn sasl_initial(mechanism: &str, data: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    cstr(&mut body, mechanism);
    body.extend_from_slice(&(data.len() as i32).to_be_bytes());
    body.extend_from_slice(data);
    frame(b'p', &body)
}

/// SASLResponse.
pub fn sasl_response(data: &[u8]) -> Vec<u8> {
    frame(b'p', data)
}

/// A backend message: its type and body.
#[derive(Debug, Clone)]
pub struct Msg {
    pub kind: u8,
    pub body: Vec<u8>,
}

impl Msg {
    /// An ErrorResponse's severity, code and message.
    pub fn error(&self) -> Option<(String, String, String)> {
        if self.kind != b'E' {
            return None;
        }
        let (mut sev, mut code, mut text) = (String::new(), String::new(), String::new());
        for field in self.body.split(|b| *b == 0) {
            if field.is_empty() {
                continue;
            }
            let v = String::from_utf8_lossy(&field[1..]).into_owned();
            match field[0] {
                b'S' => sev = v,
                b'C' => code = v,
                b'M' => text = v,
                _ => {}
            }
        }
        Some((sev, code, text))
    }

    /// An Authentication message's code.
    pub fn auth_code(&self) -> Option<i32> {
        (self.kind == b'R' && self.body.len() >= 4)
            .then(|| i32::from_be_bytes([self.body[0], self.body[1], self.body[2], self.body[3]]))
    }
}

/// Reads one backend message; `None` at the end of the stream or after `wait` of silence.
pub async fn read(stream: &mut TcpStream, wait: Duration) -> Option<Msg> {
    let mut head = [0u8; 5];
    match tokio::time::timeout(wait, stream.read_exact(&mut head)).await {
        Ok(Ok(_)) => {}
        _ => return None,
    }
    let len = i32::from_be_bytes([head[1], head[2], head[3], head[4]]);
    let mut body = vec![0u8; (len.max(4) - 4) as usize];
    match tokio::time::timeout(wait, stream.read_exact(&mut body)).await {
        Ok(Ok(_)) => Some(Msg {
            kind: head[0],
            body,
        }),
        _ => None,
    }
}

/// Everything the server sends until it closes the connection (or `wait` of silence), and
/// whether it closed.
pub async fn read_all(stream: &mut TcpStream, wait: Duration) -> (Vec<Msg>, bool) {
    let mut out = Vec::new();
    loop {
        let mut head = [0u8; 5];
        match tokio::time::timeout(wait, stream.read_exact(&mut head)).await {
            Err(_) => return (out, false),
            Ok(Err(_)) => return (out, true),
            Ok(Ok(_)) => {}
        }
        let len = i32::from_be_bytes([head[1], head[2], head[3], head[4]]);
        let mut body = vec![0u8; (len.max(4) - 4) as usize];
        match tokio::time::timeout(wait, stream.read_exact(&mut body)).await {
            Err(_) => return (out, false),
            Ok(Err(_)) => return (out, true),
            Ok(Ok(_)) => out.push(Msg {
                kind: head[0],
                body,
            }),
        }
    }
}

/// Runs SCRAM-SHA-256 after `startup(user)` up to (not including) the client's final
/// message, which it returns with the server's first message, so the caller decides what
/// to send with it.
pub async fn scram_until_final(
    stream: &mut TcpStream,
    user: &str,
    password: &str,
) -> (Vec<u8>, String) {
    stream.write_all(&startup(user)).await.unwrap();
    let m = read(stream, Duration::from_secs(5))
        .await
        .expect("SASL request");
    assert_eq!(
        m.auth_code(),
        Some(10),
        "AuthenticationSASL expected: {m:?}"
    );
    let mut scram = ScramSha256::new(password.as_bytes(), ChannelBinding::unsupported());
    stream
        .write_all(&sasl_initial("SCRAM-SHA-256", scram.message()))
        .await
        .unwrap();
    let m = read(stream, Duration::from_secs(5))
        .await
        .expect("SASL continue");
    assert_eq!(
        m.auth_code(),
        Some(11),
        "AuthenticationSASLContinue expected: {m:?}"
    );
    let server_first = String::from_utf8(m.body[4..].to_vec()).unwrap();
    scram.update(&m.body[4..]).unwrap();
    (sasl_response(scram.message()), server_first)
}

/// A complete login; the backend's process id once ReadyForQuery arrives, else the FATAL
/// error.
pub async fn login(stream: &mut TcpStream, user: &str, password: &str) -> Result<i32, Msg> {
    let (last, _) = scram_until_final(stream, user, password).await;
    stream.write_all(&last).await.unwrap();
    let mut pid = 0;
    loop {
        let m = read(stream, Duration::from_secs(5))
            .await
            .expect("login answer");
        if m.kind == b'K' {
            pid = i32::from_be_bytes([m.body[0], m.body[1], m.body[2], m.body[3]]);
        }
        if m.kind == b'Z' {
            return Ok(pid);
        }
        if m.kind == b'E' {
            return Err(m);
        }
    }
}

/// Parse (with parameter type OIDs), Bind (binary parameters, text results), Execute and
/// Sync of `sql`.
pub fn extended_binary(sql: &str, types: &[u32], params: &[Option<&[u8]>]) -> Vec<u8> {
    extended_with(sql, types, params, true)
}

/// [`extended_binary`] with the parameters sent as text.
pub fn extended_text(sql: &str, types: &[u32], params: &[Option<&[u8]>]) -> Vec<u8> {
    extended_with(sql, types, params, false)
}

fn extended_with(sql: &str, types: &[u32], params: &[Option<&[u8]>], binary: bool) -> Vec<u8> {
    let mut parse = Vec::new();
    cstr(&mut parse, "");
    cstr(&mut parse, sql);
    parse.extend_from_slice(&(types.len() as i16).to_be_bytes());
    for t in types {
        parse.extend_from_slice(&t.to_be_bytes());
    }
    let mut bind = Vec::new();
    cstr(&mut bind, "");
    cstr(&mut bind, "");
    bind.extend_from_slice(&1i16.to_be_bytes());
    bind.extend_from_slice(&i16::from(binary).to_be_bytes());
    bind.extend_from_slice(&(params.len() as i16).to_be_bytes());
    for p in params {
        match p {
            None => bind.extend_from_slice(&(-1i32).to_be_bytes()),
            Some(b) => {
                bind.extend_from_slice(&(b.len() as i32).to_be_bytes());
                bind.extend_from_slice(b);
            }
        }
    }
    bind.extend_from_slice(&0i16.to_be_bytes());
    let mut execute = Vec::new();
    cstr(&mut execute, "");
    execute.extend_from_slice(&0i32.to_be_bytes());
    [
        frame(b'P', &parse),
        frame(b'B', &bind),
        frame(b'E', &execute),
        frame(b'S', &[]),
    ]
    .concat()
}

/// Messages until ReadyForQuery (inclusive), or until `wait` of silence.
pub async fn until_ready(stream: &mut TcpStream, wait: Duration) -> Vec<Msg> {
    let mut out = Vec::new();
    while let Some(m) = read(stream, wait).await {
        let done = m.kind == b'Z';
        out.push(m);
        if done {
            break;
        }
    }
    out
}

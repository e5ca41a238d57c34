//! Frontend frames checked before pgwire decodes them.
//!
//! pgwire's decoders trust the lengths and counts inside a message: a `Parse` that declares
//! more parameter types than its body holds makes the decoder read past the end of its
//! buffer and panic. A panic in a connection task is survivable only by accident (it
//! unwinds the task), and under `panic = "abort"`, or with a lock held, it would stop the
//! server. So every byte a client sends passes through [`Checked`], which cuts the stream
//! into frames and parses each one completely here, with every length and count checked
//! against what is actually there, before pgwire sees it. A frame that does not parse ends
//! the connection with a protocol-violation error that names what was wrong; the bytes
//! themselves are never echoed (a password message may hold a secret).
//!
//! The untyped packets of the start (SSLRequest, GSSENCRequest, CancelRequest,
//! StartupMessage) are read by [`crate::server::conn`] with exact reads and checked by
//! [`startup_packet`]; everything after the StartupMessage is typed and goes through
//! [`typed_frame`].

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Longest untyped start packet (PostgreSQL's own limit for a StartupMessage).
pub const MAX_STARTUP_BYTES: usize = 10_000;
/// Longest password or SASL message (PostgreSQL's limit for an authentication token).
pub const MAX_AUTH_BYTES: usize = 65_535;
/// Longest frame of the kinds that carry only names and counts (Describe, Close, Execute,
/// Sync, Flush, Terminate, CopyDone, CopyFail).
pub const MAX_SMALL_BYTES: usize = 10_000;
/// Default longest Query, Parse, Bind or CopyData frame.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// The protocol codes of the untyped start packets.
pub const SSL_REQUEST: i32 = 80_877_103;
/// GSSAPI encryption request.
pub const GSSENC_REQUEST: i32 = 80_877_104;
/// Cancel request.
pub const CANCEL_REQUEST: i32 = 80_877_102;

/// What is wrong with a frame; the message a client and the log see.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The length field is impossible or over the limit for this kind of frame.
    #[error("invalid frontend message: {what} declares {declared} bytes, {limit}")]
    Length {
        /// The frame's kind.
        what: String,
        /// The declared length.
        declared: i64,
        /// The accepted range, in words.
        limit: String,
    },
    /// A field runs past the end of the frame, or bytes are left over after the last one.
    #[error("invalid frontend message: {what} {detail}")]
    Malformed {
        /// The frame's kind.
        what: String,
        /// What did not fit.
        detail: String,
    },
    /// A type byte that no frontend message has, or one this server does not take.
    #[error("invalid frontend message type {byte:?}")]
    UnknownType {
        /// The type byte, shown as a character when printable.
        byte: String,
    },
    /// The connection ended inside a frame.
    #[error("the connection ended inside a {what} message")]
    Truncated {
        /// The frame's kind.
        what: String,
    },
}

/// The kinds of typed frontend frames, by type byte.
fn kind(byte: u8) -> Option<&'static str> {
    Some(match byte {
        b'Q' => "Query",
        b'P' => "Parse",
        b'B' => "Bind",
        b'D' => "Describe",
        b'E' => "Execute",
        b'C' => "Close",
        b'H' => "Flush",
        b'S' => "Sync",
        b'X' => "Terminate",
        b'd' => "CopyData",
        b'c' => "CopyDone",
        b'f' => "CopyFail",
        b'p' => "password",
        _ => return None,
    })
}

/// A cursor over one frame's body that refuses to run past its end.
struct Body<'a> {
    what: &'static str,
    rest: &'a [u8],
}

impl<'a> Body<'a> {
    fn err(&self, detail: String) -> FrameError {
        FrameError::Malformed {
            what: self.what.to_string(),
            detail,
        }
    }

    fn take(&mut self, n: usize, field: &str) -> Result<&'a [u8], FrameError> {
        if self.rest.len() < n {
            return Err(self.err(format!(
                "ends inside {field} ({n} bytes needed, {} left)",
                self.rest.len()
            )));
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn i16(&mut self, field: &str) -> Result<i16, FrameError> {
        let b = self.take(2, field)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }

    fn i32(&mut self, field: &str) -> Result<i32, FrameError> {
        let b = self.take(4, field)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A count that must not be negative.
    fn count(&mut self, field: &str) -> Result<usize, FrameError> {
        let n = self.i16(field)?;
        usize::try_from(n).map_err(|_| self.err(format!("has a negative {field} ({n})")))
    }

    /// A NUL-terminated UTF-8 string.
    fn cstring(&mut self, field: &str) -> Result<&'a str, FrameError> {
        let Some(end) = self.rest.iter().position(|b| *b == 0) else {
            return Err(self.err(format!("has no terminator after {field}")));
        };
        let s = std::str::from_utf8(&self.rest[..end])
            .map_err(|_| self.err(format!("has {field} that is not UTF-8")))?;
        self.rest = &self.rest[end + 1..];
        Ok(s)
    }

    fn byte_of(&mut self, field: &str, allowed: &[u8]) -> Result<u8, FrameError> {
        let b = self.take(1, field)?[0];
        if !allowed.contains(&b) {
            return Err(self.err(format!("has {field} {:?}", char::from(b))));
        }
        Ok(b)
    }

    fn end(&self) -> Result<(), FrameError> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(self.err(format!(
                "has {} bytes after its last field",
                self.rest.len()
            )))
        }
    }
}

/// Checks a typed frame's body (the bytes after its type and length) field by field.
fn check_body(byte: u8, what: &'static str, body: &[u8]) -> Result<(), FrameError> {
    let mut b = Body { what, rest: body };
    match byte {
        b'Q' | b'f' => {
            b.cstring("the text")?;
        }
        b'P' => {
            b.cstring("the statement name")?;
            b.cstring("the query")?;
            let n = b.count("parameter type count")?;
            b.take(n * 4, "the parameter types")?;
        }
        b'B' => {
            b.cstring("the portal name")?;
            b.cstring("the statement name")?;
            let formats = b.count("parameter format count")?;
            for _ in 0..formats {
                let f = b.i16("a parameter format")?;
                if !(0..=1).contains(&f) {
                    return Err(b.err(format!("has parameter format {f} (0 or 1)")));
                }
            }
            let params = b.count("parameter count")?;
            if formats > 1 && formats != params {
                return Err(b.err(format!(
                    "gives {formats} parameter formats for {params} parameters"
                )));
            }
            for i in 0..params {
                let len = b.i32("a parameter length")?;
                match len {
                    -1 => {}
                    n if n >= 0 => {
                        b.take(n as usize, &format!("parameter {}", i + 1))?;
                    }
                    n => return Err(b.err(format!("has parameter length {n}"))),
                }
            }
            let results = b.count("result format count")?;
            for _ in 0..results {
                let f = b.i16("a result format")?;
                if !(0..=1).contains(&f) {
                    return Err(b.err(format!("has result format {f} (0 or 1)")));
                }
            }
        }
        b'D' | b'C' => {
            b.byte_of("the target kind", b"SP")?;
            b.cstring("the name")?;
        }
        b'E' => {
            b.cstring("the portal name")?;
            b.i32("the row limit")?;
        }
        // No body.
        b'H' | b'S' | b'X' | b'c' => {}
        // Opaque bodies: CopyData is the client's data; a password message's shape depends
        // on the authentication stage and is checked by the authenticator.
        b'd' | b'p' => return Ok(()),
        _ => unreachable!("kind() admitted only the bytes above"),
    }
    b.end()
}

/// The longest frame of this kind.
fn limit(byte: u8, max_message: usize) -> usize {
    match byte {
        b'Q' | b'P' | b'B' | b'd' => max_message,
        b'p' => MAX_AUTH_BYTES,
        _ => MAX_SMALL_BYTES,
    }
}

/// The length of the first complete typed frame at the start of `buf`, checked whole;
/// `Ok(None)` while more bytes are needed to tell.
pub fn typed_frame(buf: &[u8], max_message: usize) -> Result<Option<usize>, FrameError> {
    let Some(&byte) = buf.first() else {
        return Ok(None);
    };
    let Some(what) = kind(byte) else {
        return Err(FrameError::UnknownType {
            byte: if byte.is_ascii_graphic() {
                char::from(byte).to_string()
            } else {
                format!("0x{byte:02x}")
            },
        });
    };
    if buf.len() < 5 {
        return Ok(None);
    }
    let declared = i32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]);
    let max = limit(byte, max_message);
    if declared < 4 || declared as usize > max {
        return Err(FrameError::Length {
            what: what.to_string(),
            declared: declared.into(),
            limit: format!("accepted: 4 to {max}"),
        });
    }
    let total = 1 + declared as usize;
    if buf.len() < total {
        return Ok(None);
    }
    check_body(byte, what, &buf[5..total])?;
    Ok(Some(total))
}

/// An untyped start packet, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartupPacket {
    /// SSLRequest.
    Ssl,
    /// GSSENCRequest.
    GssEnc,
    /// CancelRequest: the backend's process id and secret key bytes.
    Cancel {
        /// Process id.
        pid: i32,
        /// Secret key (4 bytes in protocol 3.0, up to 256 in 3.2).
        key: Vec<u8>,
    },
    /// StartupMessage: the protocol version and the parameters in order.
    Startup {
        /// Major version.
        major: u16,
        /// Minor version.
        minor: u16,
        /// `name`, `value` pairs.
        params: Vec<(String, String)>,
    },
}

/// The declared length of an untyped start packet from its first four bytes, checked.
pub fn startup_length(head: [u8; 4]) -> Result<usize, FrameError> {
    let declared = i32::from_be_bytes(head);
    if !(8..=MAX_STARTUP_BYTES as i32).contains(&declared) {
        return Err(FrameError::Length {
            what: "startup packet".into(),
            declared: declared.into(),
            limit: format!("accepted: 8 to {MAX_STARTUP_BYTES}"),
        });
    }
    Ok(declared as usize)
}

/// Parses an untyped start packet's body (everything after its length).
pub fn startup_packet(body: &[u8]) -> Result<StartupPacket, FrameError> {
    let mut b = Body {
        what: "startup packet",
        rest: body,
    };
    let code = b.i32("the protocol code")?;
    let packet = match code {
        SSL_REQUEST => StartupPacket::Ssl,
        GSSENC_REQUEST => StartupPacket::GssEnc,
        CANCEL_REQUEST => {
            let pid = b.i32("the process id")?;
            let key = b.rest.to_vec();
            b.rest = &[];
            if !(4..=256).contains(&key.len()) {
                return Err(b.err(format!("has a {}-byte cancel key", key.len())));
            }
            StartupPacket::Cancel { pid, key }
        }
        _ => {
            let major = (code >> 16) as u16;
            let minor = (code & 0xffff) as u16;
            if major != 3 {
                return Err(b.err(format!(
                    "asks for protocol {major}.{minor}; this server speaks 3.0 and 3.2"
                )));
            }
            let mut params = Vec::new();
            loop {
                let name = b.cstring("a parameter name")?;
                if name.is_empty() {
                    break;
                }
                let value = b.cstring("a parameter value")?;
                params.push((name.to_string(), value.to_string()));
            }
            if !params.iter().any(|(k, _)| k == "user") {
                return Err(b.err("names no user".into()));
            }
            StartupPacket::Startup {
                major,
                minor,
                params,
            }
        }
    };
    b.end()?;
    Ok(packet)
}

/// Checks a SASLInitialResponse body (mechanism name, then a length of -1 or exactly the
/// bytes that follow), which pgwire's decoder reads without bounds checks.
pub fn sasl_initial_response(body: &[u8]) -> Result<(), FrameError> {
    let mut b = Body {
        what: "SASLInitialResponse",
        rest: body,
    };
    b.cstring("the mechanism")?;
    match b.i32("the response length")? {
        -1 => {}
        n if n >= 0 && n as usize == b.rest.len() => b.rest = &[],
        n => {
            return Err(b.err(format!(
                "declares a {n}-byte response and carries {}",
                b.rest.len()
            )))
        }
    }
    b.end()
}

/// A stream whose reads deliver only whole frames that [`typed_frame`] accepted. A frame
/// it refuses turns into an `InvalidData` error carrying the [`FrameError`], after every
/// frame before it was delivered; writes pass straight through.
pub struct Checked<S> {
    inner: S,
    max_message: usize,
    /// Until it is set, every frame is held to [`MAX_AUTH_BYTES`]: before a login nothing
    /// but authentication is handled, so nothing larger is buffered either.
    logged_in: Arc<AtomicBool>,
    /// Bytes read from the client, not yet checked.
    raw: BytesMut,
    /// Checked frames not yet handed on.
    ready: BytesMut,
    failed: Option<FrameError>,
    eof: bool,
}

impl<S> Checked<S> {
    /// Wraps a stream positioned just after the StartupMessage.
    pub fn new(inner: S, max_message: usize, logged_in: Arc<AtomicBool>) -> Self {
        Self {
            inner,
            max_message,
            logged_in,
            raw: BytesMut::with_capacity(8 * 1024),
            ready: BytesMut::new(),
            failed: None,
            eof: false,
        }
    }

    /// The wrapped stream.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Moves every complete, valid frame from `raw` to `ready`; records the first refusal.
    fn check_buffered(&mut self) {
        while self.failed.is_none() {
            let max = if self.logged_in.load(Ordering::Acquire) {
                self.max_message
            } else {
                MAX_AUTH_BYTES
            };
            match typed_frame(&self.raw, max) {
                Ok(Some(n)) => {
                    let frame = self.raw.split_to(n);
                    self.ready.unsplit(frame);
                }
                Ok(None) => break,
                Err(e) => self.failed = Some(e),
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Checked<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.ready.is_empty() {
                let n = this.ready.len().min(buf.remaining());
                buf.put_slice(&this.ready.split_to(n));
                return Poll::Ready(Ok(()));
            }
            if let Some(e) = &this.failed {
                return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, e.clone())));
            }
            if this.eof {
                if !this.raw.is_empty() {
                    let what = this
                        .raw
                        .first()
                        .and_then(|b| kind(*b))
                        .unwrap_or("frontend");
                    this.failed = Some(FrameError::Truncated { what: what.into() });
                    this.raw.clear();
                    continue;
                }
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; 8 * 1024];
            let mut rb = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut rb) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {
                    if rb.filled().is_empty() {
                        this.eof = true;
                    } else {
                        this.raw.extend_from_slice(rb.filled());
                        this.check_buffered();
                    }
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Checked<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// The FrameError inside an I/O error made by [`Checked`], if that is what it is.
pub fn frame_error(e: &io::Error) -> Option<&FrameError> {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<FrameError>())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// pgwire's decoding context once the start is over (typed frames).
    fn typed_context() -> datafusion_postgres::pgwire::messages::DecodeContext {
        let mut ctx = datafusion_postgres::pgwire::messages::DecodeContext::default();
        ctx.awaiting_frontend_ssl = false;
        ctx.awaiting_frontend_startup = false;
        ctx
    }

    fn frame(byte: u8, body: &[u8]) -> Vec<u8> {
        let mut f = vec![byte];
        f.extend_from_slice(&(body.len() as i32 + 4).to_be_bytes());
        f.extend_from_slice(body);
        f
    }

    fn parse_body(name: &str, query: &str, types: &[i32], declared: i16) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(name.as_bytes());
        b.push(0);
        b.extend_from_slice(query.as_bytes());
        b.push(0);
        b.extend_from_slice(&declared.to_be_bytes());
        for t in types {
            b.extend_from_slice(&t.to_be_bytes());
        }
        b
    }

    #[test]
    fn well_formed_frames_pass_whole() {
        let q = frame(b'Q', b"SELECT 1\0");
        assert_eq!(typed_frame(&q, 1 << 20), Ok(Some(q.len())));
        let p = frame(b'P', &parse_body("s", "SELECT $1", &[20], 1));
        assert_eq!(typed_frame(&p, 1 << 20), Ok(Some(p.len())));
        let mut bind = b"\0s\0".to_vec();
        bind.extend_from_slice(&1i16.to_be_bytes());
        bind.extend_from_slice(&1i16.to_be_bytes());
        bind.extend_from_slice(&2i16.to_be_bytes());
        bind.extend_from_slice(&8i32.to_be_bytes());
        bind.extend_from_slice(&7i64.to_be_bytes());
        bind.extend_from_slice(&(-1i32).to_be_bytes());
        bind.extend_from_slice(&0i16.to_be_bytes());
        let b = frame(b'B', &bind);
        assert_eq!(typed_frame(&b, 1 << 20), Ok(Some(b.len())));
        for (t, body) in [
            (b'S', &b""[..]),
            (b'H', b""),
            (b'X', b""),
            (b'E', b"\0\0\0\0\0"),
            (b'D', b"S\0"),
        ] {
            let f = frame(t, body);
            assert_eq!(typed_frame(&f, 1 << 20), Ok(Some(f.len())), "{}", t as char);
        }
        // A prefix is not yet a frame.
        assert_eq!(typed_frame(&q[..q.len() - 1], 1 << 20), Ok(None));
    }

    #[test]
    fn the_frames_that_panicked_pgwire_are_refused() {
        // A Parse that declares five parameter types and carries one.
        let p = frame(b'P', &parse_body("", "SELECT 1", &[23], 5));
        let e = typed_frame(&p, 1 << 20).unwrap_err();
        assert!(
            e.to_string().contains("ends inside the parameter types"),
            "{e}"
        );
        // A negative count.
        let p = frame(b'P', &parse_body("", "SELECT 1", &[], -1));
        assert!(typed_frame(&p, 1 << 20)
            .unwrap_err()
            .to_string()
            .contains("negative"));
        // No terminator.
        let q = frame(b'Q', b"SELECT 1");
        assert!(typed_frame(&q, 1 << 20).is_err());
        // Trailing bytes.
        let s = frame(b'S', b"x");
        assert!(typed_frame(&s, 1 << 20)
            .unwrap_err()
            .to_string()
            .contains("after its last field"));
        // Lengths below the header or over the limit.
        let mut bad = vec![b'Q'];
        bad.extend_from_slice(&3i32.to_be_bytes());
        assert!(matches!(
            typed_frame(&bad, 1 << 20),
            Err(FrameError::Length { .. })
        ));
        let mut big = vec![b'Q'];
        big.extend_from_slice(&(2_000_000i32).to_be_bytes());
        assert!(matches!(
            typed_frame(&big, 1 << 20),
            Err(FrameError::Length { .. })
        ));
        let mut sync = vec![b'S'];
        sync.extend_from_slice(&(100_000i32).to_be_bytes());
        assert!(matches!(
            typed_frame(&sync, 1 << 20),
            Err(FrameError::Length { .. })
        ));
        assert!(matches!(
            typed_frame(b"F\0\0\0\x04", 1 << 20),
            Err(FrameError::UnknownType { .. })
        ));
    }

    #[test]
    fn sasl_initial_responses_are_checked() {
        let mut ok = b"SCRAM-SHA-256\0".to_vec();
        ok.extend_from_slice(&3i32.to_be_bytes());
        ok.extend_from_slice(b"n,,");
        assert_eq!(sasl_initial_response(&ok), Ok(()));
        let mut none = b"SCRAM-SHA-256\0".to_vec();
        none.extend_from_slice(&(-1i32).to_be_bytes());
        assert_eq!(sasl_initial_response(&none), Ok(()));
        // Shorter than declared, no length at all, no terminator.
        let mut short = b"SCRAM-SHA-256\0".to_vec();
        short.extend_from_slice(&30i32.to_be_bytes());
        short.extend_from_slice(b"n,,");
        assert!(sasl_initial_response(&short).is_err());
        assert!(sasl_initial_response(b"SCRAM-SHA-256\0").is_err());
        assert!(sasl_initial_response(b"SCRAM").is_err());
    }

    #[test]
    fn start_packets_are_parsed_strictly() {
        let mut s = 196_608i32.to_be_bytes().to_vec();
        s.extend_from_slice(b"user\0alice\0database\0db\0\0");
        assert_eq!(
            startup_packet(&s),
            Ok(StartupPacket::Startup {
                major: 3,
                minor: 0,
                params: vec![
                    ("user".into(), "alice".into()),
                    ("database".into(), "db".into())
                ],
            })
        );
        assert_eq!(
            startup_packet(&SSL_REQUEST.to_be_bytes()),
            Ok(StartupPacket::Ssl)
        );
        let mut c = CANCEL_REQUEST.to_be_bytes().to_vec();
        c.extend_from_slice(&7i32.to_be_bytes());
        c.extend_from_slice(&9i32.to_be_bytes());
        assert_eq!(
            startup_packet(&c),
            Ok(StartupPacket::Cancel {
                pid: 7,
                key: 9i32.to_be_bytes().to_vec()
            })
        );
        // No user, a missing terminator, a foreign protocol, trailing bytes.
        let mut nouser = 196_608i32.to_be_bytes().to_vec();
        nouser.extend_from_slice(b"database\0db\0\0");
        assert!(startup_packet(&nouser).is_err());
        let mut open = 196_608i32.to_be_bytes().to_vec();
        open.extend_from_slice(b"user\0alice");
        assert!(startup_packet(&open).is_err());
        assert!(startup_packet(&131_072i32.to_be_bytes()).is_err());
        let mut ssl = SSL_REQUEST.to_be_bytes().to_vec();
        ssl.push(0);
        assert!(startup_packet(&ssl).is_err());
        assert!(startup_length(7i32.to_be_bytes()).is_err());
        assert!(startup_length(20_000i32.to_be_bytes()).is_err());
    }

    proptest::proptest! {
        /// Whatever the bytes, checking never panics, and a frame it accepts is one pgwire's
        /// decoder reads without panicking and to its end.
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
                                    byte in proptest::sample::select(b"QPBDECHSXdcfpFZ\x00".to_vec())) {
            let mut buf = vec![byte];
            buf.extend_from_slice(&bytes);
            if let Ok(Some(n)) = typed_frame(&buf, 1 << 20) {
                let mut b = BytesMut::from(&buf[..n]);
                let _ = datafusion_postgres::pgwire::messages::PgWireFrontendMessage::decode(&mut b, &typed_context());
            }
            let _ = startup_packet(&bytes);
        }

        /// A well-formed Parse with any declared count: accepted exactly when the count
        /// matches what the body carries.
        #[test]
        fn parse_counts_are_checked(declared in -3i16..12, carried in 0usize..8) {
            let types: Vec<i32> = (0..carried as i32).collect();
            let f = frame(b'P', &parse_body("s", "SELECT 1", &types, declared));
            let ok = typed_frame(&f, 1 << 20).is_ok();
            proptest::prop_assert_eq!(ok, declared >= 0 && declared as usize == carried);
        }
    }
}

//! What went wrong with a PEM file, said without its contents.
//!
//! rustls-pki-types' PEM errors carry the offending line's bytes in their `Display`
//! (`illegal section start: [45, 45, ...]`): for a private key whose line breaks were lost
//! on the way into an environment file or a Kubernetes Secret, that line is the whole key.
//! Every message about a certificate or key file is built here instead, from the kind of
//! error alone, so neither the wire server's nor the workers' TLS settings can print a key.

use rustls::pki_types::pem::Error;

/// A description of `e` that holds none of the file's bytes.
pub(crate) fn problem(e: &Error) -> String {
    match e {
        Error::MissingSectionEnd { .. } => {
            "a PEM section has no END line (were its line breaks lost?)".into()
        }
        Error::IllegalSectionStart { .. } => {
            "a PEM BEGIN line is malformed (were its line breaks lost?)".into()
        }
        Error::Base64Decode(_) => "a PEM section is not valid base64".into(),
        Error::Io(io) => format!("cannot be read ({})", io.kind()),
        Error::NoItemsFound => "holds no PEM item of the expected kind".into(),
        Error::SectionTooLarge => "a PEM section is larger than 256 MB".into(),
        _ => "is not usable PEM".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};

    /// A key as it looks after its line breaks were lost (a one-line environment value,
    /// or `\n` written literally): each error says what is wrong and holds no key byte.
    #[test]
    fn a_mangled_key_is_described_without_its_bytes() {
        let body = "MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgSECRETSECRETSECRET";
        let key = format!("-----BEGIN PRIVATE KEY-----\n{body}\n-----END PRIVATE KEY-----\n");
        let mangled = [
            key.replace('\n', "\\n"),
            key.replace('\n', " "),
            key.replace("-----END PRIVATE KEY-----\n", ""),
            key.replace("MIGH", "M!GH"),
        ];
        for text in &mangled {
            let e = PrivateKeyDer::from_pem_slice(text.as_bytes()).unwrap_err();
            let said = problem(&e);
            assert!(
                !said.contains("SECRET") && !said.contains("45, 45"),
                "{said}"
            );
            assert!(!said.is_empty());
            for c in CertificateDer::pem_slice_iter(text.as_bytes()) {
                if let Err(e) = c {
                    assert!(!problem(&e).contains("SECRET"));
                }
            }
        }
    }
}

//! TLS for PostgreSQL connections, with libpq's meanings of `sslmode`,
//! `sslrootcert`, `sslcert` and `sslkey`, through rustls (with ring: no
//! system library, so the build cross-compiles). The client library knows
//! only `disable`, `prefer` and `require` and checks no certificate by
//! itself: the URL's TLS keys are taken out here, before it reads the
//! URL, and the checks are made by the rustls configuration built here.
//! The URL's one other key of tickler's, `pooler` ([`Pooler`]), is taken
//! out with them.

use crate::engine::types::{Pooler, PostgresTls, RootCerts, SslMode};
use crate::error::{Error, Result};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio_postgres_rustls::MakeRustlsConnect;

/// The URL's keys that tickler reads, not the client library: TLS's, and
/// `pooler` ([`Pooler`]).
const TICKLER_KEYS: [&str; 5] = ["sslmode", "sslrootcert", "sslcert", "sslkey", "pooler"];

/// Takes tickler's keys out of a `postgres://` URL's query: the URL
/// without them (for the client library) and their values,
/// percent-decoded.
pub(super) fn split_url(url: &str) -> Result<(String, PostgresTls, Option<Pooler>)> {
    let mut tls = PostgresTls::default();
    let mut pooler = None;
    // As the client library reads it: the user and password run to the
    // first `@`, which may have a `?` before it (a password not
    // percent-encoded); the query starts after them.
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    let query_from = url[after_scheme..]
        .find('@')
        .map_or(after_scheme, |at| after_scheme + at + 1);
    let Some(query_at) = url[query_from..].find('?').map(|i| query_from + i) else {
        return Ok((url.to_owned(), tls, pooler));
    };
    let (base, query) = (&url[..query_at], &url[query_at + 1..]);
    let mut kept = Vec::new();
    let (mut cert, mut key) = (None, None);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let k = decode(k)?;
        if !TICKLER_KEYS.contains(&k.as_str()) {
            kept.push(pair);
            continue;
        }
        let v = decode(v)?;
        match k.as_str() {
            "sslmode" => tls.mode = Some(v.parse()?),
            "sslrootcert" if v == "system" => tls.root_certs = Some(RootCerts::System),
            "sslrootcert" => tls.root_certs = Some(RootCerts::File(PathBuf::from(v))),
            "sslcert" => cert = Some(PathBuf::from(v)),
            "pooler" => pooler = Some(v.parse()?),
            _ => key = Some(PathBuf::from(v)),
        }
    }
    tls.client_cert = match (cert, key) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        (Some(_), None) => return Err(Error::Config("sslcert is given without sslkey".into())),
        (None, Some(_)) => return Err(Error::Config("sslkey is given without sslcert".into())),
    };
    let url = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((url, tls, pooler))
}

fn decode(text: &str) -> Result<String> {
    percent_encoding::percent_decode_str(text)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| Error::Config(format!("{text:?} in the URL is not UTF-8 once decoded")))
}

/// The TLS settings in force and the connector they make, for every
/// connection of a `Store` (the pool's, the first one, the listener's).
#[derive(Clone)]
pub(crate) struct Tls {
    make: MakeRustlsConnect,
    mode: SslMode,
    /// How the server's certificate is checked, for error messages.
    checks: String,
}

impl Tls {
    /// The URL's settings with the builder's on top, checked and loaded
    /// (a file that cannot be read fails here, naming it).
    pub(super) fn new(url: &PostgresTls, builder: &PostgresTls) -> Result<Tls> {
        let roots = builder
            .root_certs
            .clone()
            .or_else(|| url.root_certs.clone());
        let client_cert = builder
            .client_cert
            .clone()
            .or_else(|| url.client_cert.clone());
        // `sslrootcert=system` means verify-full wherever it is given,
        // also when the builder then names other roots.
        let system_named = [&builder.root_certs, &url.root_certs]
            .iter()
            .any(|r| **r == Some(RootCerts::System));
        let mode = match builder.mode.or(url.mode) {
            Some(mode) => mode,
            None if system_named => SslMode::VerifyFull,
            None => SslMode::Prefer,
        };
        if roots == Some(RootCerts::System) && mode != SslMode::VerifyFull {
            return Err(Error::Config(format!(
                "sslrootcert=system needs sslmode=verify-full (it is {}): the system's roots \
                 sign certificates for anyone's host names",
                mode.as_str()
            )));
        }
        // As libpq: root certificates make `prefer` and `require` check
        // the chain too.
        let verify = match (mode, &roots) {
            (SslMode::VerifyFull, _) => Verify::Full,
            (SslMode::VerifyCa, _) => Verify::Chain,
            (SslMode::Disable, _) | (_, None) => Verify::Nothing,
            (_, Some(_)) => Verify::Chain,
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let roots_store = match (&roots, verify) {
            (_, Verify::Nothing) => None,
            (None, _) => {
                return Err(Error::Config(format!(
                    "sslmode={} needs sslrootcert: a PEM file of the CA certificates that sign \
                     the server's, or `system` for the operating system's",
                    mode.as_str()
                )))
            }
            (Some(roots), _) => Some(load_roots(roots)?),
        };
        let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Config(format!("TLS: {e}")))?;
        let builder = match roots_store {
            None => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(Unchecked(
                    provider.signature_verification_algorithms,
                ))),
            Some(store) => {
                let webpki = WebPkiServerVerifier::builder_with_provider(
                    Arc::new(store),
                    Arc::clone(&provider),
                )
                .build()
                .map_err(|e| Error::Config(format!("TLS: {e}")))?;
                match verify {
                    Verify::Full => builder.with_webpki_verifier(webpki),
                    _ => builder
                        .dangerous()
                        .with_custom_certificate_verifier(Arc::new(ChainOnly(webpki))),
                }
            }
        };
        let mut config = match &client_cert {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let chain = read_certs(cert, "sslcert")?;
                let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                    Error::Config(format!(
                        "sslkey {}: no private key read ({e})",
                        key.display()
                    ))
                })?;
                builder.with_client_auth_cert(chain, key_der).map_err(|e| {
                    Error::Config(format!(
                        "sslcert {} and sslkey {}: {e}",
                        cert.display(),
                        key.display()
                    ))
                })?
            }
        };
        // As libpq: servers from PostgreSQL 17 on refuse a direct TLS
        // connection (`sslnegotiation=direct`) without it, and ignore it
        // otherwise.
        config.alpn_protocols = vec![b"postgresql".to_vec()];
        let checks = match (verify, &roots) {
            (Verify::Nothing, _) => format!("sslmode={}, certificate not checked", mode.as_str()),
            (_, Some(RootCerts::System)) => {
                format!("sslmode={}, the system's root certificates", mode.as_str())
            }
            (_, Some(RootCerts::File(path))) => {
                format!("sslmode={}, sslrootcert {}", mode.as_str(), path.display())
            }
            (_, None) => format!("sslmode={}", mode.as_str()),
        };
        Ok(Tls {
            make: MakeRustlsConnect::new(config),
            mode,
            checks,
        })
    }

    /// Sets the client library's `sslmode` for this mode.
    pub(super) fn apply(&self, config: &mut postgres::Config) {
        use postgres::config::SslMode as Client;
        config.ssl_mode(match self.mode {
            SslMode::Disable => Client::Disable,
            SslMode::Prefer => Client::Prefer,
            _ => Client::Require,
        });
    }

    /// Opens one connection with these settings (`config` has had
    /// [`Tls::apply`]).
    pub(super) fn connect(
        &self,
        config: &postgres::Config,
    ) -> std::result::Result<postgres::Client, postgres::Error> {
        config.connect(self.make.clone())
    }

    /// What is checked of the server's certificate, for an error that
    /// came from the TLS handshake (`error`, as the client library gave
    /// it), with what to do where libpq would have connected.
    pub(super) fn checks(&self, error: Option<&rustls::Error>) -> String {
        use CertificateError::{NotValidForName, NotValidForNameContext};
        let refused = match error {
            Some(rustls::Error::InvalidCertificate(refused)) => Some(refused),
            _ => None,
        };
        // webpki's own reasons come as `Other`, known by their names.
        let named = |name: &str| refused.is_some_and(|r| format!("{r:?}").contains(name));
        let hint = if named("CaUsedAsEndEntity") {
            "; the server's certificate is a CA certificate (as PostgreSQL's docs' self-signed \
             `openssl req -x509` makes one), which rustls does not take as a server's: \
             sign the server's certificate with a CA, or make it with basicConstraints=CA:FALSE"
        } else if matches!(
            refused,
            Some(NotValidForName | NotValidForNameContext { .. })
        ) {
            "; only the certificate's subjectAltName is read (not its common name), and an IP \
             address must be an IP entry there"
        } else if named("UnsupportedCertVersion") {
            "; the server's certificate is X.509 version 1: make it with extensions (version 3)"
        } else {
            ""
        };
        format!("{}{hint}", self.checks)
    }
}

#[derive(Clone, Copy)]
enum Verify {
    Nothing,
    Chain,
    Full,
}

fn load_roots(roots: &RootCerts) -> Result<RootCertStore> {
    let mut store = RootCertStore::empty();
    match roots {
        RootCerts::File(path) => {
            for cert in read_certs(path, "sslrootcert")? {
                store
                    .add(cert)
                    .map_err(|e| Error::Config(format!("sslrootcert {}: {e}", path.display())))?;
            }
        }
        RootCerts::System => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = store.add_parsable_certificates(found.certs);
            if added == 0 {
                let why: Vec<String> = found.errors.iter().map(ToString::to_string).collect();
                return Err(Error::Config(format!(
                    "sslrootcert=system: no root certificate found on this system ({})",
                    why.join("; ")
                )));
            }
        }
    }
    Ok(store)
}

/// The certificates of a PEM file; an unreadable file, or one with none,
/// is an error naming the file and its setting.
fn read_certs(path: &Path, setting: &str) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<std::result::Result<Vec<_>, _>>())
        .map_err(|e| Error::Config(format!("{setting} {}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(Error::Config(format!(
            "{setting} {}: no PEM certificate in the file",
            path.display()
        )));
    }
    Ok(certs)
}

/// `prefer` and `require` without root certificates, as libpq: the
/// server's certificate is taken as it is; the handshake's signatures are
/// still checked (against the key of the certificate it sent).
#[derive(Debug)]
struct Unchecked(WebPkiSupportedAlgorithms);

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

/// `verify-ca`: the chain up to a root is checked, the host name is not.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        // The name is checked after the chain: a name mismatch means the
        // chain was good.
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_urls_tls_keys_are_taken_out_and_decoded() {
        let (url, tls, _) = split_url(
            "postgres://u:p@h:5432/db?application_name=x&sslmode=verify-full\
             &sslrootcert=%2Fetc%2Fca%20file.pem&connect_timeout=3",
        )
        .unwrap();
        assert_eq!(
            url,
            "postgres://u:p@h:5432/db?application_name=x&connect_timeout=3"
        );
        assert_eq!(tls.mode, Some(SslMode::VerifyFull));
        assert_eq!(
            tls.root_certs,
            Some(RootCerts::File(PathBuf::from("/etc/ca file.pem")))
        );
        let (url, tls, _) = split_url("postgres://h/db?sslrootcert=system").unwrap();
        assert_eq!(url, "postgres://h/db");
        assert_eq!(tls.root_certs, Some(RootCerts::System));
        assert_eq!(split_url("postgres://h/db").unwrap().0, "postgres://h/db");
        // A `?` in a password that is not percent-encoded is the
        // password's, as the client library reads it.
        let (url, tls, _) = split_url("postgres://u:p?x@h/db?sslmode=require").unwrap();
        assert_eq!(url, "postgres://u:p?x@h/db");
        assert_eq!(tls.mode, Some(SslMode::Require));
        let (url, tls, _) =
            split_url("postgres://u@a:1,b:2/db?sslmode=disable&sslmode=require").unwrap();
        assert_eq!(url, "postgres://u@a:1,b:2/db");
        assert_eq!(tls.mode, Some(SslMode::Require), "the last one wins");
        let (url, _, pooler) =
            split_url("postgres://h/db?pooler=transaction&application_name=x").unwrap();
        assert_eq!(url, "postgres://h/db?application_name=x");
        assert_eq!(pooler, Some(Pooler::Transaction));
        assert_eq!(split_url("postgres://h/db").unwrap().2, None);
        match split_url("postgres://h/db?pooler=statement") {
            Err(Error::Config(text)) => assert!(text.contains("pooler=\"statement\""), "{text}"),
            other => panic!("{:?}", other.map(|(u, _, _)| u)),
        }
    }

    #[test]
    fn bad_tls_settings_are_refused_naming_the_setting() {
        for (url, expect) in [
            ("postgres://h/db?sslmode=verify", "sslmode=\"verify\""),
            ("postgres://h/db?sslmode=allow", "sslmode=allow"),
            (
                "postgres://h/db?sslcert=/c.pem",
                "sslcert is given without sslkey",
            ),
        ] {
            match split_url(url) {
                Err(Error::Config(text)) => assert!(text.contains(expect), "{text}"),
                other => panic!("{url}: {:?}", other.map(|(u, _, _)| u)),
            }
        }
        let (_, tls, _) = split_url("postgres://h/db?sslmode=verify-full").unwrap();
        match Tls::new(&tls, &PostgresTls::default()) {
            Err(Error::Config(text)) => assert!(text.contains("needs sslrootcert"), "{text}"),
            other => panic!("{:?}", other.is_ok()),
        }
        let (_, tls, _) = split_url("postgres://h/db?sslmode=require&sslrootcert=system").unwrap();
        match Tls::new(&tls, &PostgresTls::default()) {
            Err(Error::Config(text)) => assert!(text.contains("verify-full"), "{text}"),
            other => panic!("{:?}", other.is_ok()),
        }
        let (_, tls, _) =
            split_url("postgres://h/db?sslmode=verify-ca&sslrootcert=/no/such.pem").unwrap();
        match Tls::new(&tls, &PostgresTls::default()) {
            Err(Error::Config(text)) => {
                assert!(text.contains("sslrootcert /no/such.pem"), "{text}")
            }
            other => panic!("{:?}", other.is_ok()),
        }
    }

    #[test]
    fn the_builders_settings_win_over_the_urls() {
        let (_, url, _) = split_url("postgres://h/db?sslmode=disable").unwrap();
        let builder = PostgresTls {
            mode: Some(SslMode::Require),
            ..PostgresTls::default()
        };
        assert_eq!(Tls::new(&url, &builder).unwrap().mode, SslMode::Require);
        assert_eq!(
            Tls::new(&url, &PostgresTls::default()).unwrap().mode,
            SslMode::Disable
        );
        assert_eq!(
            Tls::new(&PostgresTls::default(), &PostgresTls::default())
                .unwrap()
                .mode,
            SslMode::Prefer
        );
        let (_, url, _) = split_url("postgres://h/db?sslrootcert=system").unwrap();
        let builder = PostgresTls {
            root_certs: Some(RootCerts::File(PathBuf::from("/no/such.pem"))),
            ..PostgresTls::default()
        };
        match Tls::new(&url, &builder) {
            // Verify-full still: the builder's file is read (and missing).
            Err(Error::Config(text)) => assert!(text.contains("/no/such.pem"), "{text}"),
            other => panic!("{:?}", other.map(|t| t.mode)),
        }
    }
}

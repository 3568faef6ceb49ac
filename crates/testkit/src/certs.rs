//! Certificates for tests that speak TLS.

/// A test CA and a server certificate it signed, for DNS `names` and the
/// IP addresses `ips`: `(CA, certificate, key)` in PEM.
pub fn server_certificate(
    common_name: &str,
    names: &[&str],
    ips: &[[u8; 4]],
) -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, SanType};
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "gantry-test-ca");
    let ca = ca_params.self_signed(&ca_key).expect("CA certificate");
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let server_key = KeyPair::generate().expect("server key");
    let names = names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    let mut params = CertificateParams::new(names).expect("server params");
    for ip in ips {
        params.subject_alt_names.push(SanType::IpAddress((*ip).into()));
    }
    params.distinguished_name.push(DnType::CommonName, common_name);
    let server = params.signed_by(&server_key, &issuer).expect("server certificate");
    (ca.pem(), server.pem(), server_key.serialize_pem())
}

/// A test CA that signs server and client certificates.
pub struct TestCa {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    /// The CA certificate (PEM).
    pub pem: String,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa").finish_non_exhaustive()
    }
}

impl TestCa {
    pub fn new(name: &str) -> Self {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let pem = params.self_signed(&key).expect("CA certificate").pem();
        Self { issuer: rcgen::Issuer::new(params, key), pem }
    }

    /// A server certificate for `names`: `(certificate, key)` in PEM.
    pub fn server(&self, names: &[&str]) -> (String, String) {
        let names = names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        let params = rcgen::CertificateParams::new(names).expect("server params");
        self.sign(params)
    }

    /// A client certificate whose subject is `CN=common_name` and one `O`
    /// per organization, valid from `not_before` to `not_after` (seconds
    /// from now, negative for the past): `(certificate, key)` in PEM.
    pub fn client(
        &self,
        common_name: &str,
        organizations: &[&str],
        not_before: i64,
        not_after: i64,
    ) -> (String, String) {
        use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose};
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("client params");
        params.distinguished_name.push(DnType::CommonName, common_name);
        for organization in organizations {
            params.distinguished_name.push(DnType::OrganizationName, *organization);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let at = |seconds: i64| {
            let now = std::time::SystemTime::now();
            let offset = std::time::Duration::from_secs(seconds.unsigned_abs());
            if seconds < 0 {
                now - offset
            } else {
                now + offset
            }
        };
        params.not_before = at(not_before).into();
        params.not_after = at(not_after).into();
        self.sign(params)
    }

    fn sign(&self, params: rcgen::CertificateParams) -> (String, String) {
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.issuer).expect("signed");
        (cert.pem(), key.serialize_pem())
    }
}

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

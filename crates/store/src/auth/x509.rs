//! Client certificates (`--client-ca`), read as the Kubernetes API server
//! reads them: a certificate the TLS handshake verified against the client
//! CA names the caller, its subject's CN the user and each O a group. An
//! unsigned or expired certificate never gets here: the handshake refuses
//! it.

use std::time::SystemTime;

use x509_cert::der::asn1::Any;
use x509_cert::der::oid::ObjectIdentifier;
use x509_cert::der::Decode as _;
use x509_cert::ext::pkix::name::DirectoryString;

use super::Identity;

/// The authenticator's name in logs and refusals.
pub const AUTHENTICATOR: &str = "x509";

const COMMON_NAME: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.4.3");
const ORGANIZATION: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.4.10");

fn text(value: &Any) -> Result<String, String> {
    DirectoryString::try_from(value)
        .map(String::from)
        .map_err(|e| format!("a subject attribute is not a string: {e}"))
}

/// The identity a verified client certificate (DER) names, and when the
/// certificate expires.
pub fn identity(der: &[u8]) -> Result<(Identity, SystemTime), String> {
    let cert = x509_cert::Certificate::from_der(der)
        .map_err(|e| format!("the client certificate does not parse: {e}"))?;
    let tbs = cert.tbs_certificate();
    let subject = tbs.subject();
    let user = subject
        .iter()
        .find(|a| a.oid == COMMON_NAME)
        .map(|a| text(&a.value))
        .transpose()?
        .filter(|cn| !cn.is_empty())
        .ok_or("the client certificate's subject has no common name (CN)")?;
    let mut groups = subject
        .iter()
        .filter(|a| a.oid == ORGANIZATION)
        .map(|a| text(&a.value))
        .collect::<Result<Vec<_>, _>>()?;
    groups.push("system:authenticated".into());
    let expires = SystemTime::UNIX_EPOCH + tbs.validity().not_after.to_unix_duration();
    let identity = Identity { user, groups, authenticator: AUTHENTICATOR };
    Ok((identity, expires))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_name_is_the_user_and_each_organization_a_group() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, "alice");
        params.distinguished_name.push(rcgen::DnType::OrganizationName, "platform");
        let cert = params.self_signed(&key).unwrap();
        let (identity, expires) = identity(cert.der()).unwrap();
        assert_eq!(identity.user, "alice");
        assert_eq!(identity.groups, ["platform", "system:authenticated"]);
        assert!(expires > SystemTime::now());
        let mut nameless = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        nameless.distinguished_name = rcgen::DistinguishedName::new();
        let cert = nameless.self_signed(&key).unwrap();
        assert!(super::identity(cert.der()).unwrap_err().contains("CN"));
        assert!(super::identity(b"junk").is_err());
    }
}

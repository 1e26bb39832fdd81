//! The throw-away PKI of a test control plane: one CA that signs the apiserver's serving
//! certificate, the admin client certificate and any webhook serving certificate a test needs,
//! plus the key pair that signs ServiceAccount tokens. Everything is ECDSA P-256 (rcgen's
//! default), which Go and rustls both accept, and written as PEM files for the Go programs.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// Names the apiserver's serving certificate covers: how the tests (127.0.0.1, localhost) and
/// in-cluster clients (the `kubernetes` Service and its first ClusterIP) reach it.
const APISERVER_NAMES: &[&str] = &[
    "127.0.0.1",
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
    "10.96.0.1",
];

/// Paths of the PEM files, and the CA kept in memory to sign more certificates.
pub struct Pki {
    issuer: CertifiedIssuer<'static, KeyPair>,
    pub ca_cert: PathBuf,
    pub apiserver_cert: PathBuf,
    pub apiserver_key: PathBuf,
    pub admin_cert: PathBuf,
    pub admin_key: PathBuf,
    pub service_account_public: PathBuf,
    pub service_account_private: PathBuf,
}

/// A certificate and its private key, PEM encoded.
pub struct CertAndKey {
    pub cert_pem: String,
    pub key_pem: String,
}

impl Pki {
    /// Generates every certificate and key into `dir`.
    pub fn generate(dir: &Path) -> Result<Self> {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let issuer = new_ca()?;
        let pki = Self {
            ca_cert: dir.join("ca.crt"),
            apiserver_cert: dir.join("apiserver.crt"),
            apiserver_key: dir.join("apiserver.key"),
            admin_cert: dir.join("admin.crt"),
            admin_key: dir.join("admin.key"),
            service_account_public: dir.join("sa.pub"),
            service_account_private: dir.join("sa.key"),
            issuer,
        };
        write(&pki.ca_cert, &pki.issuer.pem())?;

        let serving = pki.serving_cert(APISERVER_NAMES).context("apiserver serving cert")?;
        write(&pki.apiserver_cert, &serving.cert_pem)?;
        write(&pki.apiserver_key, &serving.key_pem)?;

        let admin = pki.client_cert("admin", &["system:masters"]).context("admin client cert")?;
        write(&pki.admin_cert, &admin.cert_pem)?;
        write(&pki.admin_key, &admin.key_pem)?;

        let service_account = KeyPair::generate().context("service-account signing key")?;
        write(&pki.service_account_public, &service_account.public_key_pem())?;
        write(&pki.service_account_private, &service_account.serialize_pem())?;
        Ok(pki)
    }

    /// The CA certificate, PEM encoded (a webhook's caBundle, a client's trust root).
    pub fn ca_pem(&self) -> String {
        self.issuer.pem()
    }

    /// A serving certificate for `names` (DNS names or IP addresses), signed by the CA.
    pub fn serving_cert(&self, names: &[&str]) -> Result<CertAndKey> {
        let names: Vec<String> = names.iter().map(|name| (*name).to_owned()).collect();
        let mut params = CertificateParams::new(names.clone())
            .with_context(|| format!("certificate names {names:?}"))?;
        params.distinguished_name.remove(DnType::CommonName);
        params
            .distinguished_name
            .push(DnType::CommonName, names.first().cloned().unwrap_or_default());
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(params)
    }

    /// A client certificate: Kubernetes reads the user from the CN and groups from the O.
    pub fn client_cert(&self, user: &str, groups: &[&str]) -> Result<CertAndKey> {
        let mut params = CertificateParams::default();
        params.distinguished_name.remove(DnType::CommonName);
        params.distinguished_name.push(DnType::CommonName, user);
        for group in groups {
            params.distinguished_name.push(DnType::OrganizationName, *group);
        }
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params)
    }

    fn sign(&self, params: CertificateParams) -> Result<CertAndKey> {
        let key = KeyPair::generate().context("generating a key")?;
        let cert = params.signed_by(&key, &self.issuer).context("signing a certificate")?;
        Ok(CertAndKey { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
    }
}

fn new_ca() -> Result<CertifiedIssuer<'static, KeyPair>> {
    let mut params = CertificateParams::default();
    params.distinguished_name.remove(DnType::CommonName);
    params.distinguished_name.push(DnType::CommonName, "homelab-autoscaler test CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let key = KeyPair::generate().context("generating the CA key")?;
    CertifiedIssuer::self_signed(params, key).context("self-signing the CA")
}

fn write(path: &Path, pem: &str) -> Result<()> {
    fs::write(path, pem).with_context(|| format!("writing {}", path.display()))
}

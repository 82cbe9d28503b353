pub mod agent;
pub mod apiserver;
pub mod certs;
pub mod logging;
pub mod pki;
pub mod planned;

pub mod agent;
pub mod apiserver;
pub mod certs;
pub mod demo;
pub mod logging;
pub mod operator;
pub mod pki;
pub mod planned;

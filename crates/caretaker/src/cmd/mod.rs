pub mod apiserver;
pub mod pki;
pub mod planned;

//! vxmgr: a per-node VXLAN dataplane service driven by a Felix-compatible
//! calc stream. See DESIGN.md in the project docs for the layers.

pub mod calc_source;
pub mod client;
pub mod config;
pub mod daemon;
pub mod dense_map;
pub mod desired;
pub mod family_map;
pub mod fuzzing;
pub mod kernel;
pub mod manager;
pub mod metrics;
pub mod model;
pub mod reconciler;
pub mod server;
pub mod subnet_env;
pub mod wire;

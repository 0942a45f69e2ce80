//! vxmgr: a per-node VXLAN dataplane service driven by a Felix-compatible
//! calc stream. See DESIGN.md in the project docs for the layers.

pub mod config;
pub mod desired;
pub mod manager;
pub mod model;
pub mod wire;

//! Validated, typed forms of what the calc process sends, and the small value
//! types they are built from. Everything downstream of the wire works on these.

mod family;
mod mac;
pub mod update;

pub use family::Family;
pub use mac::MacAddr;
pub use update::{
    IpPool, PoolType, RemoteRouteKind, RouteIntent, RouteTypes, Update, VtepAddresses, VtepPart,
    VtepUpdate,
};

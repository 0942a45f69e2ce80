//! Canonical proto3 JSON for any message of proto/, driven by the
//! descriptors (so enums may be given by name or number, and numbers outside
//! an enum, like Felix's RouteType bitmaps, survive both ways).

use prost::{Message, Name};
use prost_reflect::{DeserializeOptions, DynamicMessage, SerializeOptions};

use super::descriptors;

#[derive(Debug, thiserror::Error)]
pub enum JsonError {
    #[error("{0}")]
    Syntax(#[from] serde_json::Error),
    #[error("{0}")]
    Proto(#[from] prost::DecodeError),
}

fn descriptor<M: Name>() -> prost_reflect::MessageDescriptor {
    descriptors()
        .get_message_by_name(&M::full_name())
        .expect("every generated message is in the descriptor set")
}

/// The message as a JSON value (lowerCamelCase names, enums by name where
/// they have one, default values left out).
pub fn to_value<M: Message + Name>(msg: &M) -> serde_json::Value {
    let dynamic = DynamicMessage::decode(descriptor::<M>(), msg.encode_to_vec().as_slice())
        .expect("a message re-decodes with its own descriptor");
    dynamic
        .serialize_with_options(
            serde_json::value::Serializer,
            &SerializeOptions::new().skip_default_fields(true),
        )
        .expect("proto messages always serialize to JSON")
}

/// The message as one line of JSON.
pub fn to_line<M: Message + Name>(msg: &M) -> String {
    to_value(msg).to_string()
}

/// Parses proto3 JSON; snake_case names are accepted too, unknown fields
/// are skipped.
pub fn from_str<M: Message + Name + Default>(text: &str) -> Result<M, JsonError> {
    Ok(parse::<M>(text)?.transcode_to::<M>()?)
}

/// Parses proto3 JSON of an `M` (as `from_str`) straight to its protobuf
/// encoding, for a message that is only to be sent.
pub fn to_bytes<M: Name>(text: &str) -> Result<Vec<u8>, JsonError> {
    Ok(parse::<M>(text)?.encode_to_vec())
}

fn parse<M: Name>(text: &str) -> Result<DynamicMessage, JsonError> {
    let mut de = serde_json::Deserializer::from_str(text);
    let dynamic = DynamicMessage::deserialize_with_options(
        descriptor::<M>(),
        &mut de,
        &DeserializeOptions::new().deny_unknown_fields(false),
    )?;
    de.end()?;
    Ok(dynamic)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::felix::{ToDataplane, to_dataplane::Payload};

    #[test]
    fn route_types_bitmaps_and_names_round_trip() {
        let msg: ToDataplane = from_str(
            r#"{"routeUpdate": {"types": 17, "ip_pool_type": "VXLAN", "dst": "10.0.0.0/32", "unknownField": 1}}"#,
        )
        .unwrap();
        let Some(Payload::RouteUpdate(r)) = &msg.payload else {
            panic!("{msg:?}")
        };
        assert_eq!((r.types, r.ip_pool_type), (17, 2));
        let back = to_line(&msg);
        assert_eq!(
            back,
            r#"{"routeUpdate":{"dst":"10.0.0.0/32","ipPoolType":"VXLAN","types":17}}"#
        );
        let named: ToDataplane =
            from_str(r#"{"routeUpdate": {"types": "LOCAL_WORKLOAD"}}"#).unwrap();
        let Some(Payload::RouteUpdate(r)) = named.payload else {
            panic!()
        };
        assert_eq!(r.types, 4);
    }

    #[test]
    fn syntax_errors_are_reported() {
        assert!(from_str::<ToDataplane>(r#"{"routeUpdate": {"#).is_err());
        assert!(from_str::<ToDataplane>(r#"{"routeUpdate": {"dst": 5}}"#).is_err());
    }
}

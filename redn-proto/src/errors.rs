//! Named errors with parameters, as varlink carries them: `{"error": "iface.Name",
//! "parameters": {...}}`.
//!
//! Each interface's errors are one enum ([`ServiceError`], [`ManagerError`],
//! [`AdminError`]) whose variants are the error names of its IDL file and whose fields are
//! the error's parameters; [`Named::to_wire`] and [`Named::from_wire`] convert between the
//! enum and the [`WireError`] on the socket. A test checks every variant against the IDL.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::fmt;

/// An error as it travels: its full name and its parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct WireError {
    /// `interface.Name`, such as `io.redn.Manager.NotSealed`.
    pub name: String,
    /// The error's parameters.
    pub parameters: Map<String, Value>,
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The name comes from the peer: printed so that it cannot reach a terminal.
        write!(f, "{}", crate::printable(&self.name))?;
        if !self.parameters.is_empty() {
            write!(f, " {}", Value::Object(self.parameters.clone()))?;
        }
        Ok(())
    }
}

/// The errors of one interface: variants named as in its IDL, fields as its parameters.
pub trait Named: Serialize + DeserializeOwned {
    /// The interface that declares the errors.
    const INTERFACE: &'static str;

    /// The error as it goes on the wire.
    fn to_wire(&self) -> WireError {
        // An externally tagged enum serialises as {"Variant": {fields}} (a unit variant as
        // the bare string "Variant"); neither can fail.
        let (short, parameters) = match serde_json::to_value(self) {
            Ok(Value::Object(map)) => match map.into_iter().next() {
                Some((name, Value::Object(p))) => (name, p),
                Some((name, _)) => (name, Map::new()),
                None => (String::new(), Map::new()),
            },
            Ok(Value::String(name)) => (name, Map::new()),
            _ => (String::new(), Map::new()),
        };
        WireError {
            name: format!("{}.{short}", Self::INTERFACE),
            parameters,
        }
    }

    /// The error, if `wire` is one of this interface's with the right parameters.
    fn from_wire(wire: &WireError) -> Option<Self> {
        let short = wire.name.strip_prefix(Self::INTERFACE)?.strip_prefix('.')?;
        let mut map = Map::new();
        map.insert(short.to_owned(), Value::Object(wire.parameters.clone()));
        serde_json::from_value(Value::Object(map)).ok()
    }
}

/// `org.varlink.service` errors, which any method may return.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs)] // the fields are the IDL's parameters, documented there
pub enum ServiceError {
    /// No such interface on this socket.
    InterfaceNotFound { interface: String },
    /// No such method in the interface.
    MethodNotFound { method: String },
    /// The method is declared but not implemented.
    MethodNotImplemented { method: String },
    /// A parameter is missing, unknown or of the wrong type.
    InvalidParameter { parameter: String },
    /// The caller may not call this.
    PermissionDenied {},
    /// The method needs the `more` flag.
    ExpectedMore {},
}

impl Named for ServiceError {
    const INTERFACE: &'static str = "org.varlink.service";
}

/// `io.redn.Manager` errors (see `io.redn.Manager.varlink` for what each means).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs)] // the fields are the IDL's parameters, documented there
pub enum ManagerError {
    /// Policy does not let the caller do this.
    PolicyDenied { reason: String },
    /// The verifier refused the offload; `log` is its log.
    VerifierRefused { offload: String, log: String },
    /// Not a memfd sealed against shrinking and growing; `kind` says what it is.
    NotSealed {
        kind: String,
        seals: u32,
        required: u32,
    },
    /// A limit would be passed.
    QuotaExceeded {
        resource: String,
        limit: u64,
        requested: u64,
    },
    /// The NIC could not do it.
    NoDevice { reason: String },
    /// A parameter is missing, malformed or out of range.
    InvalidParameter { parameter: String, reason: String },
    /// No offload of that name for this caller.
    NoSuchOffload { offload: String },
    /// No installed offload of the caller's with that handle.
    NoSuchHandle { handle: u64 },
    /// No region of the caller's with that id.
    NoSuchRegion { region: u64 },
    /// A protocol limit was broken.
    ProtocolViolation { limit: String, reason: String },
    /// Too many requests per second.
    RateLimited { requests_per_second: u32 },
    /// The peer process is gone or changed.
    PeerChanged { reason: String },
}

impl Named for ManagerError {
    const INTERFACE: &'static str = "io.redn.Manager";
}

/// `io.redn.Admin` errors.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs)] // the fields are the IDL's parameters, documented there
pub enum AdminError {
    /// No client with that id.
    NoSuchClient { client: u64 },
    /// No installed offload with that handle.
    NoSuchOffload { handle: u64 },
    /// The new policy did not load.
    ReloadFailed { reason: String },
    /// A test run could not be sent.
    TestRunFailed { reason: String },
    /// No remote client's session with that handle and instance.
    NoSuchRemote { handle: u64, instance: u64 },
    /// No ban in force on that app and address or uid.
    NoSuchBan { app: String, target: String },
    /// No app rule of that name in the policy.
    NoSuchApp { app: String },
    /// No remote client can have that address: the data plane does not serve its family.
    AddressNotServed { address: String, reason: String },
}

impl Named for AdminError {
    const INTERFACE: &'static str = "io.redn.Admin";
}

/// Every error name of each enum, with its parameter names, for checking against the IDL.
pub fn declared() -> Vec<(String, Vec<String>)> {
    fn names<E: Named>(samples: &[E]) -> Vec<(String, Vec<String>)> {
        samples
            .iter()
            .map(|e| {
                let w = e.to_wire();
                (w.name, w.parameters.keys().cloned().collect())
            })
            .collect()
    }
    let s = String::new;
    let mut out = names(&[
        ServiceError::InterfaceNotFound { interface: s() },
        ServiceError::MethodNotFound { method: s() },
        ServiceError::MethodNotImplemented { method: s() },
        ServiceError::InvalidParameter { parameter: s() },
        ServiceError::PermissionDenied {},
        ServiceError::ExpectedMore {},
    ]);
    out.extend(names(&[
        ManagerError::PolicyDenied { reason: s() },
        ManagerError::VerifierRefused {
            offload: s(),
            log: s(),
        },
        ManagerError::NotSealed {
            kind: s(),
            seals: 0,
            required: 0,
        },
        ManagerError::QuotaExceeded {
            resource: s(),
            limit: 0,
            requested: 0,
        },
        ManagerError::NoDevice { reason: s() },
        ManagerError::InvalidParameter {
            parameter: s(),
            reason: s(),
        },
        ManagerError::NoSuchOffload { offload: s() },
        ManagerError::NoSuchHandle { handle: 0 },
        ManagerError::NoSuchRegion { region: 0 },
        ManagerError::ProtocolViolation {
            limit: s(),
            reason: s(),
        },
        ManagerError::RateLimited {
            requests_per_second: 0,
        },
        ManagerError::PeerChanged { reason: s() },
    ]));
    out.extend(names(&[
        AdminError::NoSuchClient { client: 0 },
        AdminError::NoSuchOffload { handle: 0 },
        AdminError::ReloadFailed { reason: s() },
        AdminError::TestRunFailed { reason: s() },
        AdminError::NoSuchRemote {
            handle: 0,
            instance: 0,
        },
        AdminError::NoSuchBan {
            app: s(),
            target: s(),
        },
        AdminError::NoSuchApp { app: s() },
        AdminError::AddressNotServed {
            address: s(),
            reason: s(),
        },
    ]));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_go_out_by_full_name_and_come_back() {
        let e = ManagerError::NotSealed {
            kind: "memfd".into(),
            seals: 0,
            required: 6,
        };
        let w = e.to_wire();
        assert_eq!(w.name, "io.redn.Manager.NotSealed");
        assert_eq!(w.parameters["required"], 6);
        assert_eq!(ManagerError::from_wire(&w), Some(e));
        assert_eq!(AdminError::from_wire(&w), None, "another interface's error");
        let p = ServiceError::PermissionDenied {}.to_wire();
        assert_eq!(p.name, "org.varlink.service.PermissionDenied");
        assert!(p.parameters.is_empty());
        assert_eq!(
            ServiceError::from_wire(&p),
            Some(ServiceError::PermissionDenied {})
        );
    }
}

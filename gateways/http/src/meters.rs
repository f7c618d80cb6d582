//! The HTTP door's latency histograms ([`rocketgate_core::meter`]), registered
//! with the recorder (`ops.rs`) and recorded by the handlers.

/// Publish and delivery latency of the door (`protocol="http"`).
pub(crate) static METERS: rocketgate_core::meter::DoorMeters =
    rocketgate_core::meter::DoorMeters::new();

/// `rocketgate_receive_duration_seconds{protocol="http"}`: one receive (POP) call.
pub(crate) static RECEIVE: rocketgate_core::meter::Histogram =
    rocketgate_core::meter::Histogram::new();

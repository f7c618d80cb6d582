//! Why a connection ends: what every part of a connection may decide, below
//! all of them.

use mqttbytes::v5::DisconnectReasonCode;

use crate::shared::Takeover;

/// Why a connection ends.
pub(crate) enum End {
    /// The client sent DISCONNECT (publish the will only for reason 0x04).
    Client { will: bool },
    /// The socket closed or failed without DISCONNECT.
    Closed,
    /// The server closes it with this v5 reason code.
    Server(DisconnectReasonCode, String),
    /// Another connection took the session over.
    Takeover(Takeover),
    /// The server is stopping.
    Shutdown,
}

impl End {
    pub(crate) fn protocol(reason: impl Into<String>) -> End {
        End::Server(DisconnectReasonCode::ProtocolError, reason.into())
    }
}

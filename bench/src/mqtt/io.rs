//! The generator's connection: plain TCP or TLS (`--tls-ca`), one type for both so
//! the same code measures both. TLS halves share the session through
//! `tokio::io::split`; plain ones are tokio's owned halves, as before.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use rocketgate_tls::tokio_rustls::client::TlsStream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf, ReadHalf, WriteHalf};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

pub enum BenchStream {
    Tcp(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

pub enum ReadSide {
    Tcp(OwnedReadHalf),
    Tls(ReadHalf<Box<TlsStream<TcpStream>>>),
}

pub enum WriteSide {
    Tcp(OwnedWriteHalf),
    Tls(WriteHalf<Box<TlsStream<TcpStream>>>),
}

impl BenchStream {
    pub fn split(self) -> (ReadSide, WriteSide) {
        match self {
            BenchStream::Tcp(s) => {
                let (r, w) = s.into_split();
                (ReadSide::Tcp(r), WriteSide::Tcp(w))
            }
            BenchStream::Tls(s) => {
                let (r, w) = tokio::io::split(s);
                (ReadSide::Tls(r), WriteSide::Tls(w))
            }
        }
    }
}

macro_rules! read_impl {
    ($t:ty, $($v:ident),*) => {
        impl AsyncRead for $t {
            fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $(Self::$v(s) => Pin::new(s).poll_read(cx, buf),)*
                }
            }
        }
    };
}

macro_rules! write_impl {
    ($t:ty, $($v:ident),*) => {
        impl AsyncWrite for $t {
            fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    $(Self::$v(s) => Pin::new(s).poll_write(cx, buf),)*
                }
            }
            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $(Self::$v(s) => Pin::new(s).poll_flush(cx),)*
                }
            }
            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $(Self::$v(s) => Pin::new(s).poll_shutdown(cx),)*
                }
            }
        }
    };
}

read_impl!(BenchStream, Tcp, Tls);
write_impl!(BenchStream, Tcp, Tls);
read_impl!(ReadSide, Tcp, Tls);
write_impl!(WriteSide, Tcp, Tls);

//! TLS for the coordinator's API and a gateway of its own (`--tls-cert`, `--tls-key`): the
//! certificate chain and key read from PEM files, served with rustls on aws-lc-rs (the crypto
//! provider that reqwest and sqlx already use), and a listener that completes handshakes beside
//! the accept loop and hands the HTTP server only established TLS streams. A client that speaks
//! plain HTTP to it fails the handshake and gets no answer. `Listening` is where both servers
//! serve, over plain TCP or TLS alike, with graceful shutdown.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::serve::ListenerExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::server::TlsStream;

/// The PEM files a server is given: its certificate chain (its own certificate first, then any
/// intermediates) and its private key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Why a certificate and key cannot be served, naming the flag of the file at fault.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("--tls-cert {path}: {reason}")]
    Cert { path: String, reason: String },
    #[error("--tls-key {path}: {reason}")]
    Key { path: String, reason: String },
    #[error("--tls-cert and --tls-key do not make a usable pair: {0}")]
    Pair(String),
}

/// How long a client has to complete its handshake before its connection is closed.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes under way at once; past this, the listener accepts no new connection until one
/// ends (the kernel's backlog holds the others).
pub const HANDSHAKES_IN_FLIGHT_MAX: usize = 1_024;
/// Established connections waiting for the HTTP server to take them.
const ESTABLISHED_QUEUE_MAX: usize = 256;
/// The largest PEM file read: a certificate chain is a few KiB.
const PEM_BYTES_MAX: u64 = 1 << 20;

fn read_pem(path: &Path) -> Result<Vec<u8>, String> {
    let metadata = std::fs::metadata(path).map_err(|error| format!("cannot be read: {error}"))?;
    if metadata.len() > PEM_BYTES_MAX {
        return Err(format!("is over {PEM_BYTES_MAX} bytes; is it a PEM file?"));
    }
    std::fs::read(path).map_err(|error| format!("cannot be read: {error}"))
}

/// Reads the certificate chain and key, and checks that they belong together.
pub fn server_config(files: &TlsFiles) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let cert_error = |reason: String| TlsError::Cert {
        path: files.cert.display().to_string(),
        reason,
    };
    let key_error = |reason: String| TlsError::Key {
        path: files.key.display().to_string(),
        reason,
    };
    let cert_pem = read_pem(&files.cert).map_err(cert_error)?;
    let chain = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| cert_error(format!("is not a PEM certificate chain: {error}")))?;
    if chain.is_empty() {
        return Err(cert_error(
            "holds no PEM certificate (-----BEGIN CERTIFICATE-----)".to_string(),
        ));
    }
    let key_pem = read_pem(&files.key).map_err(key_error)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|error| key_error(format!("holds no PEM private key (PKCS#8, PKCS#1 or SEC1): {error}")))?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|error| TlsError::Pair(error.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|error| TlsError::Pair(error.to_string()))?;
    // HTTP/2 for clients that offer it; HTTP/1.1 for the agents' tunnels, which upgrade.
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A TCP listener that serves TLS: connections are accepted and their handshakes run on tasks
/// of their own, so a slow or silent client holds up nobody; `accept` hands out the
/// established ones. Dropping it stops accepting and closes the port.
pub struct TlsListener {
    addr: SocketAddr,
    established: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    accepting: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    pub fn new(listener: TcpListener, config: Arc<rustls::ServerConfig>) -> std::io::Result<TlsListener> {
        let addr = listener.local_addr()?;
        let (sender, established) = mpsc::channel(ESTABLISHED_QUEUE_MAX);
        let accepting = tokio::spawn(accept_loop(listener, TlsAcceptor::from(config), sender));
        Ok(TlsListener {
            addr,
            established,
            accepting,
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    established: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    let in_flight = Arc::new(Semaphore::new(HANDSHAKES_IN_FLIGHT_MAX));
    loop {
        let Ok(permit) = Arc::clone(&in_flight).acquire_owned().await else {
            return;
        };
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of file descriptors and the like: wait, as axum's own listener does.
                tracing::warn!(%error, "accepting a connection failed");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let acceptor = acceptor.clone();
        let established = established.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => {
                    let _ = established.send((tls, peer)).await;
                }
                // A plain-HTTP client, a scanner, a client that does not trust our certificate.
                Ok(Err(error)) => tracing::debug!(%peer, %error, "a TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "a TLS handshake timed out"),
            }
        });
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.established.recv().await {
            Some(established) => established,
            // The accept loop ends only when this listener is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.addr)
    }
}

/// The longest a stopping server waits for its open connections: inside `docker stop`'s 10 s
/// before its SIGKILL.
pub const DRAIN_MAX: Duration = Duration::from_secs(8);

/// Where a server listens: plain TCP, or TLS over it.
pub enum Listening {
    Plain(TcpListener),
    Tls(TlsListener),
}

impl Listening {
    /// Binds `listen`; serves TLS with `tls` when given.
    pub async fn bind(listen: &str, tls: Option<Arc<rustls::ServerConfig>>) -> std::io::Result<Listening> {
        let listener = TcpListener::bind(listen).await?;
        Ok(match tls {
            Some(config) => Listening::Tls(TlsListener::new(listener, config)?),
            None => Listening::Plain(listener),
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        match self {
            Listening::Plain(listener) => listener.local_addr(),
            Listening::Tls(listener) => Ok(listener.addr),
        }
    }

    /// Serves `app`, each request with its peer's address (`ConnectInfo<SocketAddr>`), until
    /// `stop` completes; then stops accepting and waits for the connections under way, at most
    /// [`DRAIN_MAX`]: a tunnel or a long poll would otherwise hold the stop open for good.
    pub async fn serve(
        self,
        app: axum::Router,
        stop: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let app = app.into_make_service_with_connect_info::<SocketAddr>();
        let (stopped, mut told) = tokio::sync::watch::channel(false);
        let stop = async move {
            stop.await;
            let _ = stopped.send(true);
        };
        let drained = async move {
            match self {
                Listening::Plain(listener) => axum::serve(listener, app).with_graceful_shutdown(stop).await,
                // `tap_io` changes nothing; axum gives `ConnectInfo<SocketAddr>` to a listener
                // so wrapped (an impl of ours for its `IncomingStream` would break the orphan rule).
                Listening::Tls(listener) => {
                    axum::serve(listener.tap_io(|_| {}), app)
                        .with_graceful_shutdown(stop)
                        .await
                }
            }
        };
        tokio::select! {
            served = drained => served,
            () = async {
                let _ = told.wait_for(|stopped| *stopped).await;
                tokio::time::sleep(DRAIN_MAX).await;
            } => {
                tracing::warn!(drain_s = DRAIN_MAX.as_secs(), "connections still open after the drain; closing them");
                Ok(())
            }
        }
    }
}

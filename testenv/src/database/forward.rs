//! Host ports: a container port with `hostPort` answers on the node's address, as the CNI
//! portmap plugin's DNAT rule makes it do (the kubelet asks the runtime for it in the pod
//! sandbox config). Here the node's address is a loopback address of its own, so a TCP proxy
//! from `<node InternalIP>:<hostPort>` to `<pod IP>:<containerPort>` stands in for the rule.
//! It lives as long as the pod runs on the node.

use std::net::SocketAddr;

use tokio::net::TcpSocket;
use tokio_util::sync::CancellationToken;
use tracing::debug;

/// Listens on `listen` (bound before this returns, so a clash is the caller's error) and
/// forwards each connection to `target` until `stop`.
pub(crate) fn spawn(
    listen: SocketAddr,
    target: SocketAddr,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let socket = TcpSocket::new_v4()?;
    // A pod restarted on the same node binds again while old connections linger.
    socket.set_reuseaddr(true)?;
    socket.bind(listen)?;
    let listener = socket.listen(256)?;
    tokio::spawn(async move {
        loop {
            let (mut inbound, _) = tokio::select! {
                _ = stop.cancelled() => return,
                a = listener.accept() => match a {
                    Ok(a) => a,
                    Err(e) => { debug!(%listen, error = %e, "host port accept"); continue; }
                },
            };
            let stop = stop.clone();
            tokio::spawn(async move {
                let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await else {
                    return;
                };
                tokio::select! {
                    _ = stop.cancelled() => {}
                    _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                }
            });
        }
    });
    Ok(())
}

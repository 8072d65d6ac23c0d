//! The stream side of `Exec` and `Attach`: output out, stdin in, and what happens when the
//! client goes away.

use std::sync::Arc;

use corral_proto::{Event, ExecSpec, Message, MuxError, StreamReceiver, StreamSender, CHANNEL_STDIN};
use tokio::sync::mpsc;

use crate::error::AgentError;
use crate::exec::{self, Spawned};
use crate::process_table::{Output, Process};
use crate::AgentState;

/// Runs `spec` and streams it to the client until it exits.
pub async fn exec(
    state: &Arc<AgentState>,
    spec: ExecSpec,
    tx: &mut StreamSender,
    rx: &mut StreamReceiver,
) -> Result<(), AgentError> {
    // A pty always accepts input from the stream; END only means EOF if stdin was asked for,
    // since typing Ctrl-D into an interactive shell would end it.
    let input = Input { forward: spec.stdin || spec.pty.is_some(), close_on_end: spec.stdin };
    let Spawned { process, output } = exec::spawn(state, spec)?;
    let finished = match tx.send_event(&Event::Started { pid: process.pid }).await {
        Ok(()) => stream_process(&process, output, tx, rx, input).await,
        Err(_) => false,
    };
    if !finished && !process.background {
        process.kill();
    }
    Ok(())
}

/// Streams a running process's output from now on, then its exit.
pub async fn attach(
    state: &Arc<AgentState>,
    pid: u32,
    tx: &mut StreamSender,
    rx: &mut StreamReceiver,
) -> Result<(), AgentError> {
    let process = state.processes.get(pid)?;
    let output = process.subscribe();
    let input = Input { forward: false, close_on_end: false };
    stream_process(&process, output, tx, rx, input).await;
    Ok(())
}

#[derive(Clone, Copy)]
struct Input {
    /// Write DATA on the stdin channel to the process.
    forward: bool,
    /// Close the process's stdin when the client ENDs its half of the stream.
    close_on_end: bool,
}

/// Returns whether the process's exit reached the client (false: the client went away).
async fn stream_process(
    process: &Process,
    output: mpsc::Receiver<Output>,
    tx: &mut StreamSender,
    rx: &mut StreamReceiver,
    input: Input,
) -> bool {
    tokio::select! {
        sent = forward_output(output, tx) => sent.is_ok(),
        () = pump_input(process, rx, input) => false,
    }
}

async fn forward_output(mut output: mpsc::Receiver<Output>, tx: &mut StreamSender) -> Result<(), MuxError> {
    loop {
        // A silent process must not keep a hung-up stream (and, if foreground, itself) alive.
        let item = tokio::select! {
            item = output.recv() => item,
            () = tx.closed() => return Err(MuxError::Reset),
        };
        let Some(item) = item else { break };
        match item {
            Output::Data { channel, bytes } => tx.send_data(channel, &bytes).await?,
            Output::Exited(exit) => return tx.send_event(&exit.event()).await,
        }
    }
    // The process is gone without a word; the stream just ends.
    Ok(())
}

/// Feeds client data to stdin; returns only if the stream broke while we were reading.
async fn pump_input(process: &Process, rx: &mut StreamReceiver, input: Input) {
    loop {
        match rx.recv().await {
            Some(Ok(Message::Data { channel: CHANNEL_STDIN, bytes })) if input.forward => {
                // A child that closed its stdin is not an error worth ending the stream for.
                let _ = process.write_stdin(&bytes).await;
            }
            Some(Ok(_)) => {}
            None => {
                if input.close_on_end {
                    let _ = process.close_stdin().await;
                }
                // The client may still be reading; `forward_output` notices if it hangs up.
                return std::future::pending().await;
            }
            Some(Err(_)) => return,
        }
    }
}

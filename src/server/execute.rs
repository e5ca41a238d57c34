//! The extended protocol's Bind and Execute, with rows streamed.
//!
//! pgwire's own Execute first collects every row of the portal into a vector (its portal
//! fetch), so a driver reading a large result through a prepared statement (every driver's
//! default) made the server hold all of it. This one sends each row as the query produces
//! it, as the socket takes it; with a row limit (`max_rows`, a driver's fetch size) it sends
//! that many, keeps the rest of the stream in the portal, and answers PortalSuspended.

use std::fmt::Debug;
use std::sync::Arc;

use datafusion_postgres::pgwire::api::portal::{Portal, PortalExecutionState};
use datafusion_postgres::pgwire::api::query::{send_execution_response, ExtendedQueryHandler};
use datafusion_postgres::pgwire::api::results::{QueryResponse, Response, Tag};
use datafusion_postgres::pgwire::api::store::{Entry, PortalStore};
use datafusion_postgres::pgwire::api::{
    ClientInfo, ClientPortalStore, PgWireConnectionState, DEFAULT_NAME,
};
use datafusion_postgres::pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use datafusion_postgres::pgwire::messages::extendedquery::{
    Bind, BindComplete, Execute, PortalSuspended,
};
use datafusion_postgres::pgwire::messages::response::EmptyQueryResponse;
use datafusion_postgres::pgwire::messages::PgWireBackendMessage;
use futures::{Sink, SinkExt, StreamExt};

use super::handlers::DfStatement;

/// pgwire's own `on_bind`, but `BindComplete` is queued rather than flushed: a driver
/// sends Bind, Execute and Sync together, and PostgreSQL answers them in one write at
/// Sync. Flushing it alone cost every execution of a prepared statement one more write
/// on the server and one more wake-up and read on the client (the wire bench saw five
/// `sendto` per page instead of three). A `Flush` or `Sync` still sends it.
pub(super) async fn bind<C>(client: &mut C, message: Bind) -> PgWireResult<()>
where
    C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
    C::PortalStore: PortalStore<Statement = DfStatement>,
    C::Error: Debug,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    let statement_name = message.statement_name.as_deref().unwrap_or(DEFAULT_NAME);
    let portal_name = message.portal_name.as_deref().unwrap_or(DEFAULT_NAME);
    match client.portal_store().get_statement(statement_name) {
        Some(Entry::Value(statement)) => {
            let portal = Portal::try_new(&message, statement)?;
            client.portal_store().put_portal(Arc::new(portal));
        }
        Some(Entry::Empty) => {
            if !message.parameters.is_empty() {
                return Err(PgWireError::UserError(Box::new(ErrorInfo::new(
                    "ERROR".to_owned(),
                    "08P01".to_owned(),
                    format!(
                        "bind message supplies {} parameters, but prepared statement \
                         {statement_name:?} requires 0",
                        message.parameters.len(),
                    ),
                ))));
            }
            client.portal_store().put_empty_portal(portal_name);
        }
        None => return Err(PgWireError::StatementNotFound(statement_name.to_owned())),
    }
    client
        .feed(PgWireBackendMessage::BindComplete(BindComplete::new()))
        .await?;
    Ok(())
}

/// What a portal's execution produced: rows to send, or nothing more.
enum Produced {
    Rows(QueryResponse),
    Done,
}

/// Executes a portal (running its query the first time), sending at most `max_rows` rows
/// (all when 0) as they come.
pub(super) async fn execute<H, C>(handler: &H, client: &mut C, message: Execute) -> PgWireResult<()>
where
    H: ExtendedQueryHandler<Statement = DfStatement>,
    C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
    C::PortalStore: PortalStore<Statement = DfStatement>,
    C::Error: Debug,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    if !matches!(client.state(), PgWireConnectionState::ReadyForQuery) {
        return Err(PgWireError::NotReadyForQuery);
    }
    let mut transaction = client.transaction_status();
    client.set_state(PgWireConnectionState::QueryInProgress);
    let name = message.name.as_deref().unwrap_or(DEFAULT_NAME).to_string();
    // A negative limit means none, as in PostgreSQL.
    let max_rows = usize::try_from(message.max_rows).unwrap_or(0);
    let portal = match client.portal_store().get_portal(&name) {
        Some(Entry::Value(p)) => p,
        Some(Entry::Empty) => {
            client
                .feed(PgWireBackendMessage::EmptyQueryResponse(
                    EmptyQueryResponse::new(),
                ))
                .await?;
            client.set_state(PgWireConnectionState::ReadyForQuery);
            return Ok(());
        }
        None => return Err(PgWireError::PortalNotFound(name)),
    };
    let state = portal.state();
    let mut held = state.lock().await;
    // Finished until this execution says otherwise: a panic while the rows stream (caught
    // by the connection loop) must not leave the portal to run its query again from the
    // first row at the next Execute.
    let produced = match std::mem::replace(&mut *held, PortalExecutionState::Finished) {
        PortalExecutionState::Initial => match handler.do_query(client, &portal, max_rows).await? {
            Response::Query(r) => Produced::Rows(r),
            Response::EmptyQuery => {
                client
                    .feed(PgWireBackendMessage::EmptyQueryResponse(
                        EmptyQueryResponse::new(),
                    ))
                    .await?;
                Produced::Done
            }
            Response::Execution(tag) => {
                send_execution_response(client, tag).await?;
                Produced::Done
            }
            Response::TransactionStart(tag) => {
                send_execution_response(client, tag).await?;
                transaction = transaction.to_in_transaction_state();
                Produced::Done
            }
            Response::TransactionEnd(tag) => {
                send_execution_response(client, tag).await?;
                transaction = transaction.to_idle_state();
                client.portal_store().rm_portal(DEFAULT_NAME);
                Produced::Done
            }
            Response::Error(e) => {
                client
                    .send(PgWireBackendMessage::ErrorResponse((*e).into()))
                    .await?;
                transaction = transaction.to_error_state();
                Produced::Done
            }
            Response::CopyIn(_) | Response::CopyOut(_) | Response::CopyBoth(_) => {
                return Err(PgWireError::UserError(Box::new(ErrorInfo::new(
                    "ERROR".into(),
                    "0A000".into(),
                    "COPY is not supported over the wire".into(),
                ))))
            }
        },
        PortalExecutionState::Suspended(r) => Produced::Rows(r),
        PortalExecutionState::Finished => {
            // Executed to its end already: no more rows, as PostgreSQL answers.
            *held = PortalExecutionState::Finished;
            send_execution_response(client, Tag::new("SELECT").with_rows(0)).await?;
            Produced::Done
        }
    };
    if let Produced::Rows(mut response) = produced {
        let mut rows = 0;
        let mut more = false;
        loop {
            if max_rows > 0 && rows == max_rows {
                more = true;
                break;
            }
            match response.data_rows.next().await {
                Some(Ok(row)) => {
                    client.feed(PgWireBackendMessage::DataRow(row)).await?;
                    rows += 1;
                }
                Some(Err(e)) => {
                    *held = PortalExecutionState::Finished;
                    return Err(e);
                }
                None => break,
            }
        }
        // Queued, not flushed: like PostgreSQL, the answer to Execute goes out with the
        // ReadyForQuery of the Sync (or at a Flush). A flush here made every page two writes
        // and woke the client twice (`perf trace` of the wire bench: 3,470 bytes, then 6).
        if more {
            *held = PortalExecutionState::Suspended(response);
            client
                .feed(PgWireBackendMessage::PortalSuspended(PortalSuspended::new()))
                .await?;
        } else {
            *held = PortalExecutionState::Finished;
            let tag = Tag::new(&response.command_tag).with_rows(rows);
            client
                .feed(PgWireBackendMessage::CommandComplete(tag.into()))
                .await?;
        }
    }
    client.set_state(PgWireConnectionState::ReadyForQuery);
    client.set_transaction_status(transaction);
    Ok(())
}

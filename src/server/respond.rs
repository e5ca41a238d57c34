//! What a statement sends back: its rows encoded as they arrive, in the formats the client
//! asked for and the session's text style ([`super::text`]), and the fields of a prepared
//! query's result, built once per format and per set of the session's output options.

use std::sync::{Arc, Mutex};

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::prelude::DataFrame;
use datafusion_postgres::arrow_pg::datatypes::{arrow_schema_to_pg_fields, encode_recordbatch};
use datafusion_postgres::pgwire::api::portal::Format;
use datafusion_postgres::pgwire::api::results::{FieldInfo, QueryResponse, Response};
use datafusion_postgres::pgwire::error::PgWireResult;
use datafusion_postgres::pgwire::messages::data::DataRow;
use datafusion_postgres::pgwire::types::format::FormatOptions;
use futures::StreamExt;

use super::handlers::api;
use super::text::TextStyle;
use crate::prepared::PreparedQuery;

/// Rows encoded for the client as the batches arrive, in the session's text `style`
/// (timestamps sent as text are formatted a column at a time, [`super::text`]).
pub(super) fn stream_response(
    fields: Arc<Vec<FieldInfo>>,
    batches: SendableRecordBatchStream,
    style: TextStyle,
) -> Response {
    Response::Query(query_response(fields, batches, style))
}

/// [`stream_response`]'s rows, for a caller that keeps them (a cursor's portal).
pub(super) fn query_response(
    fields: Arc<Vec<FieldInfo>>,
    batches: SendableRecordBatchStream,
    style: TextStyle,
) -> QueryResponse {
    let row_fields = fields.clone();
    let rows = batches.flat_map(move |b| {
        let rows: Box<dyn Iterator<Item = PgWireResult<DataRow>> + Send + Sync> = match b {
            Ok(b) => {
                let b = super::text::timestamps_as_text(b, &row_fields, &style);
                encode_recordbatch(row_fields.clone(), b)
            }
            Err(e) => Box::new(std::iter::once(Err(api(e)))),
        };
        futures::stream::iter(rows)
    });
    QueryResponse::new(fields, rows)
}

/// A planned query's rows in `format`, text in the session's `style`: what datafusion-postgres's
/// `encode_dataframe` does, with the timestamps of [`super::text`].
pub(super) async fn dataframe_response(
    df: DataFrame,
    style: TextStyle,
    format: &Format,
) -> PgWireResult<QueryResponse> {
    let fields = Arc::new(arrow_schema_to_pg_fields(
        df.schema().as_arrow(),
        format,
        Some(style.options.clone()),
    )?);
    let batches = df.execute_stream().await.map_err(api)?;
    Ok(query_response(fields, batches, style))
}

/// The answer to a control statement: its one-row result.
pub(super) fn batch_response(batch: RecordBatch, format: &Format) -> PgWireResult<Response> {
    let schema = batch.schema();
    let fields = Arc::new(arrow_schema_to_pg_fields(&schema, format, None)?);
    let rows: Vec<PgWireResult<DataRow>> = encode_recordbatch(fields.clone(), batch).collect();
    Ok(Response::Query(QueryResponse::new(
        fields,
        futures::stream::iter(rows),
    )))
}

/// A prepared query with its result columns as PostgreSQL fields, per result format (text
/// or binary) and the session's format options they were built for (computed once, not per
/// execution, while the options stay the same).
pub(super) struct Prepared {
    pub(super) query: Arc<PreparedQuery>,
    pub(super) schema: SchemaRef,
    /// Text (0) and binary (1) results; per-column formats are computed each time.
    fields: Mutex<[Option<FieldsFor>; 2]>,
}

/// Fields and the format options they carry.
type FieldsFor = (Arc<FormatOptions>, Arc<Vec<FieldInfo>>);

impl Prepared {
    pub(super) fn new(query: PreparedQuery) -> Self {
        Self {
            schema: query.schema(),
            query: Arc::new(query),
            fields: Mutex::new([None, None]),
        }
    }

    /// The result's fields in `format`, carrying the session's `options` (its date style,
    /// interval style, bytea output and float digits, which the encoder reads from them).
    pub(super) fn fields(
        &self,
        format: &Format,
        options: &Arc<FormatOptions>,
    ) -> PgWireResult<Arc<Vec<FieldInfo>>> {
        let build = || arrow_schema_to_pg_fields(&self.schema, format, Some(options.clone()));
        let slot = match format {
            Format::UnifiedText => 0,
            Format::UnifiedBinary => 1,
            Format::Individual(_) => return Ok(Arc::new(build()?)),
        };
        let mut known = self.fields.lock().expect("fields lock");
        if let Some((built_for, f)) = &known[slot] {
            if built_for == options {
                return Ok(f.clone());
            }
        }
        let f = Arc::new(build()?);
        known[slot] = Some((options.clone(), f.clone()));
        Ok(f)
    }
}

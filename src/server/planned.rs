//! Extended-protocol statements that are not prepared queries (a `LIMIT $1`, a row change),
//! run from the plan their Parse gave them, so that their parameters and rows follow the
//! session's zone and styles as the prepared path's do (docs/server.md).

use datafusion::arrow::array::timezone::Tz;
use datafusion::arrow::datatypes::DataType;
use datafusion::common::{ParamValues, ScalarValue};
use datafusion::logical_expr::LogicalPlan;
use datafusion::sql::sqlparser::ast::Statement;
use datafusion_postgres::arrow_pg::datatypes::df::deserialize_parameters;
use datafusion_postgres::pgwire::api::portal::Portal;
use datafusion_postgres::pgwire::api::results::Response;
use datafusion_postgres::pgwire::error::PgWireResult;

use super::conn::Login;
use super::guard::{self, authorize};
use super::handlers::{api, DfStatement};
use super::hooks::{dml_response, what};
use super::respond::dataframe_response;
use super::text::{session_zone, TextStyle};

/// Runs the plan a portal's statement was given at Parse, with the portal's parameters:
/// judged again as the [`super::hooks::Guard`] judges it at Execute, its parameters decoded and checked as
/// on the prepared path, a row change answered with its tag, rows in the portal's formats
/// and the session's `style`.
pub(super) async fn run_planned(
    login: &Login,
    portal: &Portal<DfStatement>,
    statement: &Statement,
    plan: &LogicalPlan,
    types: &[Option<DataType>],
    style: TextStyle,
) -> PgWireResult<Response> {
    authorize(login.role, guard::plan_need(plan)?, what(statement))?;
    let refs: Vec<Option<&DataType>> = types.iter().map(Option::as_ref).collect();
    let mut values: Vec<ScalarValue> = match deserialize_parameters(portal, &refs)? {
        ParamValues::List(v) => v.into_iter().map(|s| s.value).collect(),
        ParamValues::Map(_) => Vec::new(),
    };
    super::params::check_decoded(portal, &values)?;
    let zone = session_zone(&login.session.ctx, |z| {
        z.and_then(|z| <Tz as std::str::FromStr>::from_str(z).ok())
    });
    let declared: Vec<DataType> = types
        .iter()
        .map(|t| t.clone().unwrap_or(DataType::Null))
        .collect();
    super::params::local_times_in_zone(portal, &declared, &mut values, zone.as_ref());
    let bound = plan
        .clone()
        .replace_params_with_values(&ParamValues::from(values))
        .map_err(api)?;
    let df = login
        .session
        .ctx
        .execute_logical_plan(bound)
        .await
        .map_err(api)?;
    if let LogicalPlan::Dml(d) = plan {
        return dml_response(df, &d.op).await;
    }
    Ok(Response::Query(
        dataframe_response(df, style, &portal.result_column_format).await?,
    ))
}

//! The page's actions on what waits and on the flow: `POST /ui/s/{stream}/{group}/act`. A form
//! names one [`Action`] (parsed once from its `action` field); each is one call of
//! [`crate::control::operate`] or [`crate::pipeline::admit`] (the same code as the CLI and the
//! API), and its result is kept in the session for the next page (see [`back`]).

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Redirect, Response};

use super::chrome::segment;
use super::{AdminState, Viewer, forbidden, subscription, unavailable};
use crate::control::operate::{BATCH, OperateError, dead_letters, parked};
use crate::pipeline::admit::{self, PauseResult, Paused};
use crate::serve::AdminSubscription;
use crate::serve::waiting::ALL_PER_CALL;
use crate::store::keys::SubscriptionKeys;
use crate::store::redis_conn::RedisHandle;

/// The reason a dead letter made from the page carries when the operator gives none.
const DEAD_LETTER_REASON: &str = "dead-lettered by an operator";
/// Who the page's pauses and resumes are recorded as.
const BY: &str = "the admin page";

/// What is done to parked retries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ParkedOp {
    /// Make them due now ([`parked::retry_now`]).
    Retry,
    /// Remove them for good ([`parked::delete`]).
    Delete,
    /// Move them to the dead letters ([`parked::dead_letter_now`]).
    DeadLetter,
}

/// Which parked retries an action is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Reach {
    /// One retry, by its origin id (and due time).
    One,
    /// The ticked ones of the bulk form.
    Selected,
    /// All of them, [`ALL_PER_CALL`] a press.
    All,
}

/// One of the page's actions: what a form's `action` field names, so that the page that
/// shows a form and the handler that carries it out agree on one name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Action {
    /// Requeue one dead letter onto the stream.
    Requeue,
    /// Requeue the dead letters the filter shows.
    RequeueAll,
    /// Delete one dead letter.
    DeleteDead,
    /// Pause the subscription on every host.
    Pause,
    /// Resume it.
    Resume,
    /// An operation on parked retries.
    Parked(ParkedOp, Reach),
    /// Give every turn of an ordered key back (its waiting entries go).
    ReleaseKey,
}

/// A form named an action the page does not know.
#[derive(Debug, thiserror::Error)]
#[error("unknown action {0:?}")]
pub(super) struct UnknownAction(String);

impl Action {
    /// Every action, for parsing.
    const ALL: [Self; 15] = [
        Self::ReleaseKey,
        Self::Requeue,
        Self::RequeueAll,
        Self::DeleteDead,
        Self::Pause,
        Self::Resume,
        Self::Parked(ParkedOp::Retry, Reach::One),
        Self::Parked(ParkedOp::Delete, Reach::One),
        Self::Parked(ParkedOp::DeadLetter, Reach::One),
        Self::Parked(ParkedOp::Retry, Reach::Selected),
        Self::Parked(ParkedOp::Delete, Reach::Selected),
        Self::Parked(ParkedOp::DeadLetter, Reach::Selected),
        Self::Parked(ParkedOp::Retry, Reach::All),
        Self::Parked(ParkedOp::Delete, Reach::All),
        Self::Parked(ParkedOp::DeadLetter, Reach::All),
    ];

    /// Its name in a form's `action` field: the one spelling of it.
    pub(super) fn name(self) -> &'static str {
        match self {
            Self::Requeue => "requeue",
            Self::RequeueAll => "requeue-all",
            Self::DeleteDead => "delete-dead",
            Self::Pause => "pause",
            Self::Resume => "resume",
            Self::Parked(ParkedOp::Retry, Reach::One) => "retry-now",
            Self::Parked(ParkedOp::Delete, Reach::One) => "delete-parked",
            Self::Parked(ParkedOp::DeadLetter, Reach::One) => "dead-letter",
            Self::Parked(ParkedOp::Retry, Reach::Selected) => "retry-selected",
            Self::Parked(ParkedOp::Delete, Reach::Selected) => "delete-selected",
            Self::Parked(ParkedOp::DeadLetter, Reach::Selected) => "dead-letter-selected",
            Self::Parked(ParkedOp::Retry, Reach::All) => "retry-all",
            Self::Parked(ParkedOp::Delete, Reach::All) => "delete-all",
            Self::Parked(ParkedOp::DeadLetter, Reach::All) => "dead-letter-all",
            Self::ReleaseKey => "release-key",
        }
    }

    /// The action a form's `action` field names.
    pub(super) fn parse(name: &str) -> Result<Self, UnknownAction> {
        Self::ALL
            .into_iter()
            .find(|a| a.name() == name)
            .ok_or_else(|| UnknownAction(name.to_owned()))
    }

    /// What the page asks before it sends the form, if anything: about stream `stream`, group
    /// `group`, with `parked` retries waiting. The bulk form's question is the script's to
    /// complete (`{n}`: how many are ticked).
    pub(super) fn confirm(self, stream: &str, group: &str, parked: u64) -> Option<String> {
        let question = match self {
            Self::Requeue | Self::Parked(ParkedOp::Retry | ParkedOp::DeadLetter, Reach::One) => {
                return None;
            }
            Self::RequeueAll => "Requeue every dead letter shown by this filter?".to_owned(),
            Self::DeleteDead => "Delete this dead letter for good?".to_owned(),
            Self::Pause => format!(
                "Pause stream {stream} group {group} on every host? Deliveries in flight finish; nothing new is read until it is resumed."
            ),
            Self::Resume => format!("Resume stream {stream} group {group} on every host?"),
            Self::Parked(ParkedOp::Delete, Reach::One) => "Delete this retry for good?".to_owned(),
            Self::Parked(_, Reach::Selected) => {
                "Apply this to the {n} selected retries?".to_owned()
            }
            Self::Parked(ParkedOp::Retry, Reach::All) => {
                format!("Make all {parked} parked retries due now (up to {ALL_PER_CALL} a press)?")
            }
            Self::Parked(ParkedOp::Delete, Reach::All) => format!(
                "Delete all {parked} parked retries for good (up to {ALL_PER_CALL} a press)? They are not dead-lettered."
            ),
            Self::Parked(ParkedOp::DeadLetter, Reach::All) => {
                format!("Dead-letter all {parked} parked retries (up to {ALL_PER_CALL} a press)?")
            }
            Self::ReleaseKey => "Release this key? Its waiting entries go now, even while what holds its turn (a parked retry, a dead letter) is not settled.".to_owned(),
        };
        Some(question)
    }

    /// The subscription's page the result shows on (empty: the overview).
    fn page(self) -> &'static str {
        match self {
            Self::Requeue | Self::RequeueAll | Self::DeleteDead => "dead-letters",
            Self::Pause | Self::Resume => "",
            Self::Parked(..) => "parked",
            Self::ReleaseKey => "keys",
        }
    }
}

impl ParkedOp {
    /// What became of the retries, for the result.
    fn done(self) -> &'static str {
        match self {
            Self::Retry => "made due now",
            Self::Delete => "deleted",
            Self::DeadLetter => "dead-lettered",
        }
    }

    /// What follows a retry's result: when `them` are back on the stream.
    fn sweep(self, them: &str) -> String {
        match self {
            Self::Retry => format!("; a sweep moves {them} back within a second"),
            Self::Delete | Self::DeadLetter => String::new(),
        }
    }
}

/// One action form: which, on what.
#[derive(Default)]
struct ActForm {
    csrf: String,
    action: String,
    id: Option<String>,
    origin: Option<String>,
    due_ms: Option<i64>,
    reason: Option<String>,
    /// The ticked entries of a bulk form: `<due_ms>|<origin id>` each.
    picks: Vec<String>,
}

impl ActForm {
    /// The form's fields from its urlencoded body; a field given twice keeps its last value,
    /// but every `pick`. Unknown fields are ignored, as a browser may add some.
    fn parse(body: &[u8]) -> Self {
        let mut form = Self::default();
        for (name, value) in form_urlencoded::parse(body) {
            let value = value.into_owned();
            match &*name {
                "csrf" => form.csrf = value,
                "action" => form.action = value,
                "id" => form.id = Some(value),
                "origin" => form.origin = Some(value),
                "due_ms" => form.due_ms = value.parse().ok(),
                "reason" => form.reason = Some(value),
                "pick" => form.picks.push(value),
                _ => {}
            }
        }
        form
    }

    /// The operator's reason, trimmed, if they gave one.
    fn reason(&self) -> Option<&str> {
        self.reason
            .as_deref()
            .map(str::trim)
            .filter(|r| !r.is_empty())
    }
}

/// The parked retries of a bulk form's ticks, looked up by due time and origin id: at most
/// [`BATCH`] a request, as the API allows.
async fn picked(
    conn: &mut RedisHandle,
    set: &str,
    picks: &[String],
) -> Result<Vec<Vec<u8>>, OperateError> {
    if picks.len() > BATCH {
        return Err(OperateError::Invalid(format!(
            "at most {BATCH} entries a request: tick fewer"
        )));
    }
    let mut members = Vec::new();
    // The same tick twice is one entry.
    let picks: std::collections::BTreeSet<&String> = picks.iter().collect();
    for pick in picks {
        let Some((due, origin)) = pick.split_once('|') else {
            return Err(OperateError::Invalid(format!(
                "not a ticked entry: {pick:?}"
            )));
        };
        let due = due
            .parse::<i64>()
            .map_err(|_| OperateError::Invalid(format!("not a ticked entry: {pick:?}")))?;
        let found = parked::find(conn, set, &[origin.to_owned()], Some(due)).await?;
        members.extend(found.into_iter().map(|p| p.member));
    }
    Ok(members)
}

/// The first [`BATCH`] members of `set`, earliest due first.
async fn first_parked(conn: &mut RedisHandle, set: &str) -> Result<Vec<Vec<u8>>, OperateError> {
    Ok(redis::cmd("ZRANGE")
        .arg(set)
        .arg(0)
        .arg(BATCH - 1)
        .query_async(conn)
        .await?)
}

/// `POST /ui/s/{stream}/{group}/act`: check the form and the viewer's right, carry out the
/// action, and send the viewer back to the page it concerns.
pub(super) async fn act(
    State(state): State<AdminState>,
    axum::Extension(viewer): axum::Extension<Viewer>,
    Path((stream, group)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Response {
    let form = ActForm::parse(&body);
    if let Err(refusal) = allowed(&state, &viewer, &form, (&stream, &group)) {
        return *refusal;
    }
    let (sub, keys) = match subscription(&state, &stream, &group) {
        Ok(found) => found,
        Err(page) => return *page,
    };
    let action = match Action::parse(&form.action) {
        Ok(action) => action,
        Err(unknown) => return unavailable(OperateError::Invalid(unknown.to_string())),
    };
    let mut doing = Doing {
        conn: sub.conn.clone(),
        set: keys.delayed.clone().unwrap_or_default(),
        keys,
        sub,
        form: &form,
    };
    match doing.run(action).await {
        Ok(done) => {
            tracing::info!(stream, group, action = action.name(), "{done} (admin page)");
            crate::serve::audit::page_action(sub, &viewer.who, action.name(), None, &done).await;
            back(&state, &viewer, (&stream, &group), action.page(), done)
        }
        Err(err) => unavailable(err),
    }
}

/// Whether the form is the session's own (its CSRF token) and the viewer may act.
fn allowed(
    state: &AdminState,
    viewer: &Viewer,
    form: &ActForm,
    (stream, group): (&str, &str),
) -> Result<(), Box<Response>> {
    if !super::guard::same_secret(&form.csrf, &viewer.csrf) {
        tracing::warn!(stream, group, "admin page action refused: bad CSRF token");
        return Err(Box::new(forbidden(
            "the form is stale or came from another site: reload the page",
        )));
    }
    if !viewer.can_act {
        return Err(Box::new(forbidden(if state.read_only {
            "the admin server is read-only (admin_read_only = true)"
        } else if state.token.is_some() {
            "actions need the admin token: log in again"
        } else {
            "actions need an admin token (admin_token_file or admin_token_env) to log in with, or admin_open_on_loopback = true"
        })));
    }
    Ok(())
}

/// Keep `done` for the viewer's next page and send them to `page` of the subscription (the
/// overview when empty). The result is kept in the session, never put in a link: a link
/// anyone can make would put any text in the banner.
fn back(
    state: &AdminState,
    viewer: &Viewer,
    (stream, group): (&str, &str),
    page: &str,
    done: String,
) -> Response {
    state.sessions.set_flash(&viewer.id, done);
    let to = if page.is_empty() {
        "/ui/".to_owned()
    } else {
        format!("/ui/s/{}/{}/{page}", segment(stream), segment(group))
    };
    Redirect::to(&to).into_response()
}

/// An action under way: the subscription it is about, a connection to its Redis, the form.
struct Doing<'a> {
    conn: RedisHandle,
    keys: SubscriptionKeys,
    /// The delayed-retry set (empty when the subscription has none).
    set: std::sync::Arc<str>,
    sub: &'a AdminSubscription,
    form: &'a ActForm,
}

impl Doing<'_> {
    /// Carry out `action`; what it came to, for the banner.
    async fn run(&mut self, action: Action) -> Result<String, OperateError> {
        match action {
            Action::Requeue => self.requeue().await,
            Action::RequeueAll => self.requeue_all().await,
            Action::DeleteDead => self.delete_dead().await,
            Action::Pause => self.pause().await,
            Action::Resume => self.resume().await,
            Action::Parked(op, Reach::One) => self.parked_one(op).await,
            Action::Parked(op, Reach::Selected) => self.parked_selected(op).await,
            Action::Parked(op, Reach::All) => self.parked_all(op).await,
            Action::ReleaseKey => self.release_key().await,
        }
    }

    /// Release the ordered key the form names (its `id`).
    async fn release_key(&mut self) -> Result<String, OperateError> {
        let key = self.form.id.clone().unwrap_or_default();
        let Some((spec, ttl_ms)) = &self.sub.ordered else {
            return Err(OperateError::Invalid(
                "this subscription is not ordered".into(),
            ));
        };
        let keys = crate::pipeline::order::OrderKeys::new(&self.keys.stream, &self.keys.group);
        let (turns, went) = crate::pipeline::order::release(
            &mut self.conn,
            &keys,
            &self.set,
            &crate::pipeline::order::digest(key.as_bytes()),
            spec.max_in_flight_per_key,
            *ttl_ms,
        )
        .await?;
        Ok(format!(
            "key {key}: {turns} turn(s) given back, {went} waiting entr{} let in",
            if went == 1 { "y" } else { "ies" }
        ))
    }

    async fn requeue(&mut self) -> Result<String, OperateError> {
        let id = self.form.id.clone().unwrap_or_default();
        let gone = format!("{id} was already gone");
        let Some(letter) = dead_letters::get(&mut self.conn, &self.keys, &id).await? else {
            return Ok(gone);
        };
        Ok(
            match dead_letters::requeue(&mut self.conn, &self.keys, &letter, false).await? {
                dead_letters::Requeued::To(new) => {
                    format!("requeued {id} onto the stream as {new}")
                }
                dead_letters::Requeued::Gone => gone,
            },
        )
    }

    async fn requeue_all(&mut self) -> Result<String, OperateError> {
        let (letters, more) =
            dead_letters::requeueable(&mut self.conn, &self.keys, self.form.reason(), ALL_PER_CALL)
                .await?;
        let mut moved = 0usize;
        for letter in &letters {
            if let dead_letters::Requeued::To(_) =
                dead_letters::requeue(&mut self.conn, &self.keys, letter, false).await?
            {
                moved += 1;
            }
        }
        let rest = if more {
            "; more remain: requeue all again"
        } else {
            ""
        };
        Ok(format!("requeued {moved} dead letters{rest}"))
    }

    async fn delete_dead(&mut self) -> Result<String, OperateError> {
        let id = self.form.id.clone().unwrap_or_default();
        let n = dead_letters::delete(&mut self.conn, &self.keys, std::slice::from_ref(&id)).await?;
        Ok(format!("deleted {n} dead letter ({id})"))
    }

    /// The subscription's pause, not the partition's: a pause holds every partition.
    async fn pause(&mut self) -> Result<String, OperateError> {
        let (stream, group) = (&self.sub.of.stream, &self.sub.of.group);
        let asked = Paused::now(BY, self.form.reason.as_deref());
        Ok(
            match admit::pause(&mut self.conn, stream, group, asked).await? {
                PauseResult::Paused(p) => format!(
                    "stream {stream} group {group}: {}; every host stops reading within a second",
                    p.describe()
                ),
                PauseResult::Already(p) => {
                    format!("stream {stream} group {group}: already {}", p.describe())
                }
            },
        )
    }

    async fn resume(&mut self) -> Result<String, OperateError> {
        let (stream, group) = (&self.sub.of.stream, &self.sub.of.group);
        Ok(
            match admit::resume(&mut self.conn, stream, group, BY).await? {
                Some(_) => format!(
                    "stream {stream} group {group}: resumed; every host reads again within a second"
                ),
                None => format!("stream {stream} group {group} was not paused"),
            },
        )
    }

    /// Apply `op` to `members` of the delayed set; how many it moved.
    async fn apply(&mut self, op: ParkedOp, members: &[Vec<u8>]) -> Result<usize, OperateError> {
        Ok(match op {
            ParkedOp::Retry => parked::retry_now(&mut self.conn, &self.set, members).await?,
            ParkedOp::Delete => parked::delete(&mut self.conn, &self.set, members).await?,
            ParkedOp::DeadLetter => {
                let reason = self.form.reason().unwrap_or(DEAD_LETTER_REASON);
                parked::dead_letter_now(&mut self.conn, &self.keys, members, reason).await?
            }
        })
    }

    /// One parked retry, by its origin id and due time.
    async fn parked_one(&mut self, op: ParkedOp) -> Result<String, OperateError> {
        let origins: Vec<String> = self.form.origin.iter().cloned().collect();
        let found = parked::find(&mut self.conn, &self.set, &origins, self.form.due_ms).await?;
        let members: Vec<Vec<u8>> = found.into_iter().map(|p| p.member).collect();
        let origin = origins.first().cloned().unwrap_or_default();
        let n = self.apply(op, &members).await?;
        Ok(format!("{origin}: {n} {}{}", op.done(), op.sweep("it")))
    }

    /// The ticked retries of the bulk form.
    async fn parked_selected(&mut self, op: ParkedOp) -> Result<String, OperateError> {
        let members = picked(&mut self.conn, &self.set, &self.form.picks).await?;
        let asked = self
            .form
            .picks
            .iter()
            .collect::<std::collections::BTreeSet<_>>()
            .len();
        let n = self.apply(op, &members).await?;
        Ok(format!(
            "{n} of {asked} selected {}{}",
            op.done(),
            op.sweep("them")
        ))
    }

    /// Every parked retry, bounded like the API's `all` calls: the rest on the next press.
    async fn parked_all(&mut self, op: ParkedOp) -> Result<String, OperateError> {
        let rounds = ALL_PER_CALL / BATCH;
        let mut moved = 0usize;
        let mut more = false;
        for round in 0..rounds {
            let n = match op {
                ParkedOp::Retry => parked::retry_batch_now(&mut self.conn, &self.set).await?,
                ParkedOp::Delete | ParkedOp::DeadLetter => {
                    let members = first_parked(&mut self.conn, &self.set).await?;
                    self.apply(op, &members).await?
                }
            };
            moved += n;
            if n == 0 {
                break;
            }
            more = round + 1 == rounds;
        }
        let rest = if more {
            "; more remain: press again"
        } else {
            ""
        };
        Ok(format!("{moved} parked retries {}{rest}", op.done()))
    }
}

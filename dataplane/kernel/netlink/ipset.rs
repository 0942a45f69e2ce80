//! The ipsets of allowed VXLAN sources. Member changes and reads go over
//! netlink, all of a change's messages in flight at once: starting `ipset`
//! costs a fork and an exec (1–2 ms) per change. A full replace still goes
//! through `ipset restore` (ipset_restore.rs).

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use ipnetwork::IpNetwork;
use rtnetlink::packet_core::NLM_F_CREATE;

use super::ipset_message::{IpsetCommand, IpsetMessage, error_text};
use super::ipset_spec::{ExistingSet, MAX_ELEMENTS, SET_TYPE};
use super::{MAX_IN_FLIGHT, NetlinkBackend, ipset_restore};
use crate::kernel::KernelError;
use crate::kernel::objects::IpsetChange;
use crate::model::Family;
use tracing::info;

/// The newest hash:net revision `ipset` 7.x knows: a set of a newer one
/// (from a newer kernel) could not be listed, saved or replaced with it.
const NEWEST_KNOWN_REVISION: u8 = 7;

/// Members in one add or del message: enough that a big change takes few
/// messages (each is a round through the kernel), few enough that a refused
/// one is cheap to send again member by member. 256 fit in 10 KB.
const MEMBERS_PER_MESSAGE: usize = 256;

/// Members of one message, and the kernel's refusal.
struct Refused<'a> {
    command: IpsetCommand,
    members: &'a [IpNetwork],
    error: KernelError,
}

impl NetlinkBackend {
    pub(super) async fn apply_ipset(
        &self,
        name: &str,
        family: Family,
        change: &IpsetChange,
    ) -> Result<(), KernelError> {
        match change {
            IpsetChange::Update { add, del } => self.update_ipset(name, family, add, del).await,
            IpsetChange::Replace { members } => {
                let existing = self.existing_set(name, family).await?;
                ipset_restore::replace(name, family, members, existing).await
            }
        }
    }

    /// Adds and deletes members. A member that is already there (or already
    /// gone) is no error, as with `ipset -exist`. A set found missing is
    /// created, and the messages it refused are sent again.
    async fn update_ipset(
        &self,
        name: &str,
        family: Family,
        add: &[IpNetwork],
        del: &[IpNetwork],
    ) -> Result<(), KernelError> {
        let messages: Vec<_> = add
            .chunks(MEMBERS_PER_MESSAGE)
            .map(|m| (IpsetCommand::Add, m))
            .chain(
                del.chunks(MEMBERS_PER_MESSAGE)
                    .map(|m| (IpsetCommand::Del, m)),
            )
            .collect();
        if messages.is_empty() {
            return self.create_ipset(name, family).await;
        }
        let mut refused = self.send_members(name, messages).await;
        if refused.iter().any(|r| is_missing_set(&r.error)) {
            self.create_ipset(name, family).await?;
            let (missing, others): (Vec<_>, Vec<_>) =
                refused.into_iter().partition(|r| is_missing_set(&r.error));
            refused = others;
            let again = missing.iter().map(|r| (r.command, r.members)).collect();
            refused.extend(self.send_members(name, again).await);
        }
        // The kernel stops at the first member of a message it refuses and,
        // as no member carries a line number, does not say which it was:
        // each member of a refused message is sent alone, which names the
        // bad ones and applies the rest.
        let (mut refused, several): (Vec<_>, Vec<_>) =
            refused.into_iter().partition(|r| r.members.len() == 1);
        let alone = several
            .iter()
            .flat_map(|r| r.members.chunks(1).map(|m| (r.command, m)))
            .collect();
        refused.extend(self.send_members(name, alone).await);
        first_refusal(refused)
    }

    /// Sends the messages all at once (up to MAX_IN_FLIGHT); returns the
    /// refused ones.
    async fn send_members<'a>(
        &self,
        name: &str,
        messages: Vec<(IpsetCommand, &'a [IpNetwork])>,
    ) -> Vec<Refused<'a>> {
        let mut messages = messages.into_iter();
        let mut in_flight = FuturesUnordered::new();
        let mut refused = Vec::new();
        loop {
            while in_flight.len() < MAX_IN_FLIGHT {
                match messages.next() {
                    Some((command, members)) => {
                        in_flight.push(self.send_message(name, command, members))
                    }
                    None => break,
                }
            }
            match in_flight.next().await {
                Some(Some(r)) => refused.push(r),
                Some(None) => {}
                None => return refused,
            }
        }
    }

    /// Without NLM_F_EXCL the kernel takes each member as `-exist`.
    async fn send_message<'a>(
        &self,
        name: &str,
        command: IpsetCommand,
        members: &'a [IpNetwork],
    ) -> Option<Refused<'a>> {
        let message = IpsetMessage::members(command, name, members);
        let error = self.ipsets.request(message, 0).await.err()?;
        Some(Refused {
            command,
            members,
            error,
        })
    }

    /// `ipset create NAME hash:net family FAMILY maxelem MAX_ELEMENTS -exist`
    /// at the revision `ipset` would pick: the kernel's newest that `ipset`
    /// knows. The kernel wants a revision, and refuses one it lacks.
    async fn create_ipset(&self, name: &str, family: Family) -> Result<(), KernelError> {
        let answers = self
            .ipsets
            .request(IpsetMessage::type_query(SET_TYPE, family), 0)
            .await
            .map_err(|e| context(&format!("looking up {SET_TYPE}"), e))?;
        let revision = answers
            .iter()
            .find_map(IpsetMessage::revision)
            .ok_or_else(|| KernelError::other(format!("the kernel named no {SET_TYPE} revision")))?
            .min(NEWEST_KNOWN_REVISION);
        let create = IpsetMessage::create(name, SET_TYPE, revision, family, MAX_ELEMENTS);
        // NLM_F_CREATE without NLM_F_EXCL is what `ipset create -exist`
        // sends; the kernel only looks for NLM_F_EXCL.
        match self.ipsets.request(create, NLM_F_CREATE).await {
            Ok(_) => Ok(()),
            // -exist only forgives a set that has the same type, family and
            // maxelem.
            Err(e) if e.errno == Some(libc::EEXIST) => Err(KernelError {
                message: format!(
                    "creating {name}: a set of that name exists with another \
                     type, family or maxelem"
                ),
                ..e
            }),
            Err(e) => Err(context(&format!("creating {name}"), e)),
        }
    }

    /// Whether the set exists, and if so whether as vxmgr makes it.
    async fn existing_set(&self, name: &str, family: Family) -> Result<ExistingSet, KernelError> {
        match self.ipsets.request(IpsetMessage::header(name), 0).await {
            Ok(answers) => Ok(existing(name, &answers, family)),
            Err(e) if is_missing_set(&e) => Ok(ExistingSet::Missing),
            Err(e) => Err(context(&format!("reading the header of ipset {name}"), e)),
        }
    }

    /// Members of each of these sets that exists as vxmgr makes them. A
    /// set of another type or family is left out: it is replaced whole.
    pub(super) async fn dump_ipsets(
        &self,
        sets: &[(String, Family)],
    ) -> Result<Vec<(String, Vec<IpNetwork>)>, KernelError> {
        let mut found = Vec::new();
        for (name, family) in sets {
            match self.ipsets.dump(IpsetMessage::list(name)).await {
                Ok(answers) if existing(name, &answers, *family) == ExistingSet::Other => {}
                Ok(answers) => found.push((
                    name.clone(),
                    answers
                        .iter()
                        .flat_map(IpsetMessage::listed_members)
                        .collect(),
                )),
                Err(e) if is_missing_set(&e) => {}
                Err(e) => return Err(context(&format!("listing ipset {name}"), e)),
            }
        }
        Ok(found)
    }
}

/// What the header in a list or header answer says of the set.
fn existing(name: &str, answers: &[IpsetMessage], family: Family) -> ExistingSet {
    match answers.iter().find_map(|a| a.is_set_of(SET_TYPE, family)) {
        Some(false) => {
            info!(
                set = name,
                "ipset has another type or family than {SET_TYPE} {family}: replacing it"
            );
            ExistingSet::Other
        }
        _ => ExistingSet::Ours,
    }
}

/// The first refused member's error, saying how many more there were.
fn first_refusal(refused: Vec<Refused>) -> Result<(), KernelError> {
    let count = refused.len();
    let Some(Refused {
        command,
        members,
        error,
    }) = refused.into_iter().next()
    else {
        return Ok(());
    };
    let verb = match command {
        IpsetCommand::Add => "adding",
        _ => "deleting",
    };
    let mut error = context(&format!("{verb} {}", members[0]), error);
    if count > 1 {
        error.message += &format!(" (and {} more)", count - 1);
    }
    Err(error)
}

/// The kernel's answer to a request naming a set that does not exist.
fn is_missing_set(error: &KernelError) -> bool {
    error.errno == Some(libc::ENOENT)
}

/// The kernel's ipset codes (beyond the errno range) worded.
fn describe(error: KernelError) -> KernelError {
    match error.errno.and_then(error_text) {
        Some(text) => KernelError {
            message: text.to_string(),
            ..error
        },
        None => error,
    }
}

fn context(what: &str, error: KernelError) -> KernelError {
    let error = describe(error);
    KernelError {
        message: format!("{what}: {}", error.message),
        ..error
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipset_codes_are_described_and_errnos_kept() {
        let error = context("creating s", KernelError::from_errno(4098));
        assert_eq!(error.errno, Some(4098));
        assert_eq!(
            error.message,
            "creating s: set type not supported by the kernel"
        );
        let error = describe(KernelError::from_errno(libc::ENOENT));
        assert_eq!(error, KernelError::from_errno(libc::ENOENT));
    }

    #[test]
    fn a_refusal_names_the_first_member_and_counts_the_others() {
        let members: Vec<IpNetwork> = ["0.0.0.0/0", "::/0"]
            .iter()
            .map(|m| m.parse().unwrap())
            .collect();
        let refused = members
            .chunks(1)
            .map(|m| Refused {
                command: IpsetCommand::Add,
                members: m,
                error: KernelError::from_errno(4104),
            })
            .collect();
        let error = first_refusal(refused).unwrap_err();
        assert_eq!(error.errno, Some(4104));
        assert_eq!(
            error.message,
            "adding 0.0.0.0/0: the prefix length is out of range for the set (and 1 more)"
        );
        assert_eq!(first_refusal(Vec::new()), Ok(()));
    }
}

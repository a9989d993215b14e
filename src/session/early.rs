//! A guest read before its plan asks for it: while the nodes' GPU facts are read (the
//! desired state waits for them: a guest's GPU userspace version is its node's driver),
//! the guest's probes are already known from the inventory alone, since no probe carries
//! a desired value. Its answers serve the plan's first read of that guest when it asks
//! exactly those probes; any other read goes to the guest.

use std::sync::{Arc, Mutex};

use crate::access::{AccessError, TargetReader};
use crate::resources::wire::{Facts, Probe};

/// The probes one read asked and what they answered.
type Asked = (Vec<Probe>, Result<Facts, AccessError>);

/// What an early read asked and what it got, until a read takes it.
#[derive(Default)]
pub(super) struct EarlyRead(Mutex<Option<Asked>>);

impl EarlyRead {
    /// No early read: the plan's read goes to the guest.
    pub fn none() -> Self {
        EarlyRead::default()
    }

    /// `probes`, read as `answer`.
    pub fn of(probes: Vec<Probe>, answer: Result<Facts, AccessError>) -> Self {
        EarlyRead(Mutex::new(Some((probes, answer))))
    }

    /// The answer, once, to the first read; only when it asks the same probes.
    fn take(&self, probes: &[Probe]) -> Option<Result<Facts, AccessError>> {
        let (asked, answer) = self.0.lock().unwrap_or_else(|p| p.into_inner()).take()?;
        (asked == probes).then_some(answer)
    }
}

/// A guest's reader whose first read may be answered by an [`EarlyRead`].
pub(super) struct Prefetched {
    pub early: Arc<EarlyRead>,
    pub inner: Box<dyn TargetReader>,
}

impl TargetReader for Prefetched {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn read(&self, probes: &[Probe]) -> Result<Facts, AccessError> {
        match self.early.take(probes) {
            Some(answer) => answer,
            None => self.inner.read(probes),
        }
    }

    fn not_read(&self) -> Option<String> {
        self.inner.not_read()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::managed::ManagedProbe;

    /// Counts the reads that reach the target.
    struct Target(Mutex<usize>);

    impl TargetReader for Target {
        fn describe(&self) -> String {
            "t".into()
        }
        fn read(&self, _: &[Probe]) -> Result<Facts, AccessError> {
            *self.0.lock().unwrap() += 1;
            Ok(Facts::Empty)
        }
    }

    #[test]
    fn an_early_read_answers_the_first_read_of_the_same_probes_once() {
        let probes = vec![Probe::Managed(ManagedProbe {})];
        let counted = Arc::new(Target(Mutex::new(0)));
        let p = Prefetched {
            early: Arc::new(EarlyRead::of(probes.clone(), Ok(Facts::Empty))),
            inner: Box::new(Counted(counted.clone())),
        };
        p.read(&probes).unwrap();
        assert_eq!(*counted.0.lock().unwrap(), 0, "answered early");
        p.read(&probes).unwrap();
        assert_eq!(*counted.0.lock().unwrap(), 1, "only once");

        // Other probes: the early answer is dropped and the target read.
        let other = Prefetched {
            early: Arc::new(EarlyRead::of(Vec::new(), Ok(Facts::Empty))),
            inner: Box::new(Counted(counted.clone())),
        };
        other.read(&probes).unwrap();
        assert_eq!(*counted.0.lock().unwrap(), 2);
        other.read(&[]).unwrap();
        assert_eq!(*counted.0.lock().unwrap(), 3, "not kept for a later read");
    }

    struct Counted(Arc<Target>);

    impl TargetReader for Counted {
        fn describe(&self) -> String {
            self.0.describe()
        }
        fn read(&self, probes: &[Probe]) -> Result<Facts, AccessError> {
            self.0.read(probes)
        }
    }
}

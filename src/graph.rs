//! A set of jobs and the order between them, stored in one transaction
//! ([`crate::Queue::enqueue_graph`]).

use crate::error::{Error, Result};
use crate::job::{IfParentFails, JobId, NewJob};
use std::collections::{BTreeMap, HashMap};

/// Jobs that run after one another, named by step, stored at once by
/// [`crate::Queue::enqueue_graph`]: every step or none, each edge as
/// [`NewJob::after_with`] makes it. A step may also run after jobs
/// already stored ([`NewJob::after`] on its job).
///
/// ```
/// # fn main() -> tickler::Result<()> {
/// # let dir = tempfile::tempdir().unwrap();
/// # let queue = tickler::Queue::open(dir.path().join("q.db"))?;
/// use tickler::{Graph, IfParentFails, JobState, NewJob};
/// let ids = queue.enqueue_graph(
///     Graph::new()
///         .step("fetch", NewJob::new("fetch"))
///         .step("transform", NewJob::new("transform"))
///         .step("upload", NewJob::new("upload"))
///         .step("clean", NewJob::new("clean_up"))
///         .edge("fetch", "transform")
///         .edge("transform", "upload")
///         .edge_with("upload", "clean", IfParentFails::Run),
/// )?;
/// assert_eq!(queue.get(ids["upload"])?.state, JobState::Waiting);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct Graph {
    steps: Vec<(String, NewJob)>,
    edges: Vec<(String, String, IfParentFails)>,
}

/// A step's place in the rows of one insert, or a stored job: what a job
/// runs after, as the engines store it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Parent {
    /// A job stored before.
    Job(JobId),
    /// An earlier row of the same insert.
    Row(usize),
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Self {
        Graph::default()
    }

    /// Adds a step named `name` (unique in the graph).
    pub fn step(mut self, name: impl Into<String>, job: NewJob) -> Self {
        self.steps.push((name.into(), job));
        self
    }

    /// `child` runs after `parent` succeeds and is cancelled if it fails
    /// ([`IfParentFails::Cancel`]).
    pub fn edge(self, parent: &str, child: &str) -> Self {
        self.edge_with(parent, child, IfParentFails::Cancel)
    }

    /// `child` runs after `parent` ends, doing `if_fails` if it fails.
    pub fn edge_with(mut self, parent: &str, child: &str, if_fails: IfParentFails) -> Self {
        self.edges
            .push((parent.to_owned(), child.to_owned(), if_fails));
        self
    }

    /// The steps in an order where each comes after its parents, with the
    /// rows each runs after, or why the graph cannot be stored: a name
    /// used twice or unknown ([`Error::InvalidArgument`]), a cycle
    /// ([`Error::DependencyCycle`]).
    #[allow(clippy::type_complexity)]
    pub(crate) fn into_rows(
        self,
    ) -> Result<(Vec<String>, Vec<(NewJob, Vec<(Parent, IfParentFails)>)>)> {
        let mut index: HashMap<&str, usize> = HashMap::new();
        for (i, (name, _)) in self.steps.iter().enumerate() {
            if index.insert(name.as_str(), i).is_some() {
                return Err(Error::InvalidArgument(format!(
                    "the graph has two steps named {name:?}"
                )));
            }
        }
        let find = |name: &str| {
            index.get(name).copied().ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "the graph's edge names step {name:?}, which it does not have"
                ))
            })
        };
        // parents[c]: (parent step, policy), one edge per pair (the last).
        let mut parents: Vec<BTreeMap<usize, IfParentFails>> =
            vec![BTreeMap::new(); self.steps.len()];
        for (parent, child, if_fails) in &self.edges {
            let (p, c) = (find(parent)?, find(child)?);
            parents[c].insert(p, *if_fails);
        }
        let order = topological(&parents).map_err(|cycle| Error::DependencyCycle {
            steps: cycle.into_iter().map(|i| self.steps[i].0.clone()).collect(),
        })?;
        let mut row_of = vec![0; self.steps.len()];
        for (row, &step) in order.iter().enumerate() {
            row_of[step] = row;
        }
        let mut steps: Vec<Option<(String, NewJob)>> = self.steps.into_iter().map(Some).collect();
        let mut names = Vec::with_capacity(order.len());
        let mut rows = Vec::with_capacity(order.len());
        for &step in &order {
            let (name, mut job) = steps[step].take().expect("each step once");
            let mut after: Vec<(Parent, IfParentFails)> = std::mem::take(&mut job.after)
                .into_iter()
                .map(|(id, p)| (Parent::Job(id), p))
                .collect();
            after.extend(
                parents[step]
                    .iter()
                    .map(|(&p, &f)| (Parent::Row(row_of[p]), f)),
            );
            names.push(name);
            rows.push((job, after));
        }
        Ok((names, rows))
    }
}

/// The steps in an order where each follows its parents (by first
/// appearance among equals), or one cycle, its first step repeated last.
fn topological(
    parents: &[BTreeMap<usize, IfParentFails>],
) -> std::result::Result<Vec<usize>, Vec<usize>> {
    // Depth first from each step in order: 0 unseen, 1 on the path, 2 done.
    let mut mark = vec![0u8; parents.len()];
    let mut order = Vec::with_capacity(parents.len());
    for start in 0..parents.len() {
        if mark[start] != 0 {
            continue;
        }
        // (step, its parents not yet visited)
        let mut path: Vec<(usize, Vec<usize>)> =
            vec![(start, parents[start].keys().rev().copied().collect())];
        mark[start] = 1;
        while let Some((step, rest)) = path.last_mut() {
            let step = *step;
            match rest.pop() {
                Some(p) if mark[p] == 1 => {
                    // The path runs from child to parent: from p to here,
                    // then p again, read backwards, is in edge order.
                    let at = path.iter().position(|(s, _)| *s == p).expect("on the path");
                    let mut cycle: Vec<usize> = path[at..].iter().map(|(s, _)| *s).collect();
                    cycle.push(p);
                    cycle.reverse();
                    return Err(cycle);
                }
                Some(p) if mark[p] == 0 => {
                    mark[p] = 1;
                    path.push((p, parents[p].keys().rev().copied().collect()));
                }
                Some(_) => {}
                None => {
                    mark[step] = 2;
                    order.push(step);
                    path.pop();
                }
            }
        }
    }
    Ok(order)
}

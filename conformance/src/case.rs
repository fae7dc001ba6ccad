//! Every conformance case, by name. The list below is the one place a case is registered: it
//! makes [`Case`] here (what a harness names in
//! [`Harness::not_applicable`](crate::Harness::not_applicable), so a misspelt name fails to
//! compile) and [`Case::run`]'s dispatch in [`cases`](crate::cases), and the functions' names are
//! the test names. Adding a case is one function in `cases/` and one line here.

/// Hands the list of every case (`module::function => Variant`) to the macro `$then`.
macro_rules! with_cases {
    ($then:ident) => {
        $then! {
            writes::roundtrip_matches_writer => RoundtripMatchesWriter,
            writes::model_based_operations => ModelBasedOperations,
            writes::open_missing_is_not_found => OpenMissingIsNotFound,
            writes::invalid_keys_are_rejected => InvalidKeysAreRejected,
            writes::overwrite_replaces_whole => OverwriteReplacesWhole,
            create_new::create_new_refuses_existing => CreateNewRefusesExisting,
            create_new::create_new_race_has_one_winner => CreateNewRaceHasOneWinner,
            create_new::large_create_new_race_has_one_winner => LargeCreateNewRaceHasOneWinner,
            create_new::interleaved_commits_resolve_in_order => InterleavedCommitsResolveInOrder,
            create_new::create_new_race_step_by_step => CreateNewRaceStepByStep,
            writes::undeclared_capabilities_are_unsupported => UndeclaredCapabilitiesAreUnsupported,
            writes::abort_on_drop_leaves_nothing => AbortOnDropLeavesNothing,
            writes::failed_writes_leave_key_unchanged => FailedWritesLeaveKeyUnchanged,
            writes::deadlines_are_kept => DeadlinesAreKept,
            writes::sharded_checkpoint_is_all_or_nothing => ShardedCheckpointIsAllOrNothing,
            faults::fault_at_every_operation => FaultAtEveryOperation,
            faults::file_system_fault_at_every_operation => FileSystemFaultAtEveryOperation,
            crash::power_loss_at_every_operation => PowerLossAtEveryOperation,
            crash::process_crash_at_every_step => ProcessCrashAtEveryStep,
            read_back::read_back_follows_writes => ReadBackFollowsWrites,
            positioned::positioned_writes_land_whole => PositionedWritesLandWhole,
            reads::readers_keep_their_version => ReadersKeepTheirVersion,
            reads::batched_reads_match_single_reads => BatchedReadsMatchSingleReads,
            reads::corrupt_containers_fail_cleanly => CorruptContainersFailCleanly,
            reads::sources_are_shared_between_threads => SourcesAreSharedBetweenThreads,
            reads::listing_spans_pages => ListingSpansPages,
            scope::deletes_and_listings_keep_to_their_key => DeletesAndListingsKeepToTheirKey,
            scope::writes_in_progress_are_pending => WritesInProgressArePending,
            scope::cleaning_spares_writes_in_progress => CleaningSparesWritesInProgress,
            memory::peak_memory_is_bounded => PeakMemoryIsBounded,
            checkpoints::checkpoints_list_and_verify => CheckpointsListAndVerify,
            checkpoints::failed_saves_never_become_checkpoints => FailedSavesNeverBecomeCheckpoints,
            checkpoints::retention_keeps_what_it_says => RetentionKeepsWhatItSays,
            checkpoints::racing_saves_commit_once => RacingSavesCommitOnce,
            checkpoints::interleaved_saves_commit_once => InterleavedSavesCommitOnce,
            incremental::incremental_chains_survive_faults_and_gc => IncrementalChainsSurviveFaultsAndGc,
            incremental::compressed_chains_survive_faults_and_gc => CompressedChainsSurviveFaultsAndGc,
            compressed_crash::compressed_saves_survive_power_loss => CompressedSavesSurvivePowerLoss,
            compressed_crash::compressed_saves_survive_kills => CompressedSavesSurviveKills,
            tiered::tiered_promotions_survive_durable_faults => TieredPromotionsSurviveDurableFaults,
            ranks::ranks_commit_when_the_last_finishes => RanksCommitWhenTheLastFinishes,
            ranks::rank_impostors_are_refused => RankImpostorsAreRefused,
            ranks::rank_restarts_after_commit_change_nothing => RankRestartsAfterCommitChangeNothing,
            ranks::racing_committers_make_one_record => RacingCommittersMakeOneRecord,
            ranks::interleaved_rank_reruns_keep_one_part => InterleavedRankRerunsKeepOnePart,
            ranks::ranks_finishing_together_commit_once => RanksFinishingTogetherCommitOnce,
            ranks::overlapping_slices_are_refused => OverlappingSlicesAreRefused,
            ranks::failing_ranks_never_damage_a_step => FailingRanksNeverDamageAStep,
            ranks::gc_keeps_committed_rank_steps => GcKeepsCommittedRankSteps,
        }
    };
}
pub(crate) use with_cases;

/// Defines [`Case`] from the list.
macro_rules! define_case {
    ($($module:ident :: $function:ident => $variant:ident,)*) => {
        /// A conformance case, by name: what [`Harness::not_applicable`] lists, and what
        /// [`Suite`](crate::Suite) runs as the test of the same name.
        ///
        /// [`Harness::not_applicable`]: crate::Harness::not_applicable
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[non_exhaustive]
        pub enum Case {
            $(
                #[doc = concat!("[`cases::", stringify!($module), "::", stringify!($function), "`](crate::cases::", stringify!($module), "::", stringify!($function), ")")]
                $variant,
            )*
        }

        impl Case {
            /// Every case, in the order a suite runs them.
            pub const ALL: &'static [Case] = &[$(Case::$variant),*];

            /// The case's name: its function's, and its test's in a suite.
            pub fn name(self) -> &'static str {
                match self {
                    $(Case::$variant => stringify!($function),)*
                }
            }
        }
    };
}

with_cases!(define_case);

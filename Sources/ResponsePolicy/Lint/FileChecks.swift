/// The checks `policy lint` makes around the files rather than inside one policy: paths that
/// cannot be read, YAML that is not a policy, suppression comments, simulation scripts. Described
/// like lint rules so `--list-rules`, the docs and SARIF name every rule id that can appear.
///
/// Their examples are not run through ``Policy/analyze(_:file:catalog:)`` (they need a path, a
/// folder or the command line); the CLI tests run each through `policy lint` instead.
package enum FileChecks {
    static func describe(
        _ id: String, _ severity: Severity, _ summary: String, _ rationale: String, triggering: [String] = [],
        nonTriggering: [String] = []
    ) -> LintRuleDescription {
        LintRuleDescription(
            id: id, summary: summary, rationale: rationale, severity: severity, triggering: triggering,
            nonTriggering: nonTriggering)
    }

    package static let descriptions: [LintRuleDescription] = [
        describe(
            "unreadable-file", .error, "a PATH that does not exist or cannot be read",
            "A check that silently skips a file it was asked for would pass a policy nobody looked at; "
                + "lint exits 66 instead."),
        describe(
            "file-too-large", .error, "a file larger than the input limit",
            "Policies are small; a file over the limit (YAMLLimits.maxFileBytes, 16 MiB by default) is refused "
                + "before it is read whole, so a wrong path or a hostile file cannot exhaust memory."),
        describe(
            "not-a-policy", .error, "a file named on the command line that is not a policy",
            "A YAML file whose top level is a list, or has no 'policy:' key and none of a policy's sections (a "
                + "Kubernetes manifest, a CI file), was named by mistake. Found by searching a folder, such a file is skipped with a note "
                + "instead; '--exclude GLOB' keeps it out of the search altogether.",
            triggering: ["apiVersion: v1\nkind: ConfigMap\n"],
            nonTriggering: ["policy: 1\nname: example\n"]),
        describe(
            "unused-suppression", .warning,
            "a '# policy-lint: disable=RULE' comment that suppresses nothing",
            "A suppression outlives the finding it was written for: the comment then only hides the next real "
                + "problem. It also reports a suppression that names an unknown rule or an error (errors cannot "
                + "be suppressed).",
            triggering: ["policy: 1\nname: example\n# policy-lint: disable=unbounded-backoff no longer needed\n"],
            nonTriggering: [
                "policy: 1\nname: example\nrules: [{ when: { status: [503] }, then: retry }]\n"
                    + "retry:\n  backoff: exponential\n  max-delay: none  # policy-lint: disable=unbounded-backoff "
                    + "the deadline bounds it\n"
            ]),
        describe(
            "missing-file", .error, "a simulation script names a policy file that does not exist",
            "A script's 'policy:' and its 'reload:' steps name policies relative to the script; a wrong path "
                + "would only show when the script runs.",
            triggering: ["policy: nowhere.yaml\nrequests:\n  - { id: a, responses: [{ status: 200 }] }\n"]),
        describe(
            "duplicate-id", .error, "two requests of a simulation script share an id",
            "Events and expectations name requests by id; two with the same id cannot be told apart.",
            triggering: [
                "requests:\n  - { id: a, responses: [{ status: 200 }] }\n  - { id: a, responses: [{ status: 200 }] }\n"
            ]),
        describe(
            "too-many-requests", .error, "a simulation script sends more requests than the simulator allows",
            "'repeat' and aliases multiply requests; the limit (\(SimulationScript.maxRequests)) keeps a "
                + "script from exhausting memory."),
        describe(
            "too-many-reloads", .error,
            "a simulation script reloads more often, or more files, than the simulator allows",
            "Each reload compiles a policy; at most \(SimulationScript.maxReloads) steps naming at most "
                + "\(SimulationScript.maxReloadFiles) files (of at most \(SimulationScript.maxReloadPolicyBytes >> 20) MiB "
                + "each) keep a script from costing minutes."),
        describe(
            "too-many-processes", .error, "a fleet script declares more processes than the simulator allows",
            "Each process is an engine of its own; at most \(FleetScript.maxProcesses) ('repeat' included) keep a "
                + "fleet script small enough to read and to run in seconds."),
        describe(
            "too-many-events", .error, "a fleet script lists more events than the simulator allows",
            "At most \(FleetScript.maxEvents) restarts, kills and store outages keep a fleet script bounded."),
    ]
}

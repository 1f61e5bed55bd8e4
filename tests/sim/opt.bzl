"""Runs a cc binary built with -c opt, whatever the command line says.

The lock simulation spends most of its time in the core and in RE2; at the
default fastbuild (-O0) it is about 7x slower, too slow for the number of
schedules the test runs. `opt_test` wraps a cc_binary built in the opt
configuration (a Starlark transition: only that binary and its dependencies
are built a second time) as a test; `opt_binary` does the same for
`bazel run`, so long runs need no `-c opt` (which would make a shared Bazel
server drop its analysis cache).
"""

def _opt_transition_impl(settings, attr):
    return {"//command_line_option:compilation_mode": "opt"}

_opt_transition = transition(
    implementation = _opt_transition_impl,
    inputs = [],
    outputs = ["//command_line_option:compilation_mode"],
)

def _opt_wrapper_impl(ctx):
    binary = ctx.attr.binary[0]
    src = binary[DefaultInfo].files_to_run.executable
    out = ctx.actions.declare_file(ctx.label.name)
    ctx.actions.symlink(output = out, target_file = src, is_executable = True)
    runfiles = ctx.runfiles(files = [src]).merge(binary[DefaultInfo].default_runfiles)
    return [DefaultInfo(executable = out, runfiles = runfiles)]

_ATTRS = {
    "binary": attr.label(cfg = _opt_transition, executable = True, mandatory = True),
    "_allowlist_function_transition": attr.label(
        default = "@bazel_tools//tools/allowlists/function_transition_allowlist",
    ),
}

opt_test = rule(implementation = _opt_wrapper_impl, test = True, attrs = _ATTRS)

opt_binary = rule(implementation = _opt_wrapper_impl, executable = True, attrs = _ATTRS)

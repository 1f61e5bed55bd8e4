"""fuzz_binary: a cc_binary built with the clang/libFuzzer/ASan/UBSan toolchain.

    fuzz_binary(name = "state_fuzzer", binary = ":state_fuzzer_bin")

The wrapped cc_binary (tag it "manual") and everything it depends on are
built through a Starlark transition to //tools/fuzz:toolchain. A transition,
unlike a --config, neither discards the shared Bazel server's analysis cache
nor writes into the main build's output directory, so switching between
`bazel build //...` and the fuzzers costs nothing. The result is a libFuzzer
executable: `bazel-bin/tests/fuzz/state_fuzzer corpus/ -max_total_time=30`.
"""

def _fuzz_transition_impl(settings, attr):
    return {
        "//command_line_option:crosstool_top": "//tools/fuzz:toolchain",
        "//command_line_option:cpu": "k8",
        "//command_line_option:compiler": "clang",
        "//command_line_option:compilation_mode": "opt",
    }

_fuzz_transition = transition(
    implementation = _fuzz_transition_impl,
    inputs = [],
    outputs = [
        "//command_line_option:crosstool_top",
        "//command_line_option:cpu",
        "//command_line_option:compiler",
        "//command_line_option:compilation_mode",
    ],
)

def _fuzz_binary_impl(ctx):
    binary = ctx.attr.binary[0]
    src = binary[DefaultInfo].files_to_run.executable
    out = ctx.actions.declare_file(ctx.label.name)
    ctx.actions.symlink(output = out, target_file = src, is_executable = True)
    runfiles = ctx.runfiles(files = [src]).merge(binary[DefaultInfo].default_runfiles)
    return [DefaultInfo(executable = out, runfiles = runfiles)]

fuzz_binary = rule(
    implementation = _fuzz_binary_impl,
    executable = True,
    attrs = {
        "binary": attr.label(cfg = _fuzz_transition, executable = True, mandatory = True),
        "_allowlist_function_transition": attr.label(
            default = "@bazel_tools//tools/allowlists/function_transition_allowlist",
        ),
    },
)

//! The commands `redn` knows, as one table: parsing, `help` and the shell completions are
//! all made from it, so they cannot disagree.

/// One command of one object.
#[derive(Debug)]
pub struct Cmd {
    /// The object (`client`, `offload`, ...).
    pub object: &'static str,
    /// The command (`show`, `kill`, ...).
    pub name: &'static str,
    /// Its arguments as `help` shows them (`ID`, `FILE [--policy PATH] [--app NAME]`).
    pub args: &'static str,
    /// What completes each positional argument: `file` (a path) or nothing.
    pub completes: Option<&'static str>,
    /// Options it takes besides the global ones.
    pub options: &'static [&'static str],
    /// One line for `help`.
    pub summary: &'static str,
}

/// The options of the commands that show an admin list (every page of it without them).
const LIST_OPTIONS: &[&str] = &["--offset", "--limit"];

/// Every command. The first command of each object is its default (`redn client` is
/// `redn client show`).
pub const COMMANDS: &[Cmd] = &[
    Cmd {
        object: "dev",
        name: "show",
        args: "",
        completes: None,
        options: &[],
        summary: "the manager's backend device: name, backend, GUID, PCI address, data plane, \
                  objects held (as `rdma dev show` and `rdma res show`)",
    },
    Cmd {
        object: "client",
        name: "show",
        args: "[--offset N] [--limit N]",
        completes: None,
        options: LIST_OPTIONS,
        summary: "apps the manager knows: identity, regions, pinned bytes, offloads",
    },
    Cmd {
        object: "client",
        name: "kill",
        args: "ID",
        completes: None,
        options: &[],
        summary: "disconnect client ID and uninstall its offloads",
    },
    Cmd {
        object: "offload",
        name: "show",
        args: "[--offset N] [--limit N]",
        completes: None,
        options: LIST_OPTIONS,
        summary: "installed offloads: handle, owner, queues, keys, code bytes, counters",
    },
    Cmd {
        object: "offload",
        name: "dump",
        args: "HANDLE",
        completes: None,
        options: &[],
        summary: "an installed offload's program and its WQEs as laid out in its code region",
    },
    Cmd {
        object: "offload",
        name: "verify",
        args: "FILE [--policy PATH] [--app NAME]",
        completes: Some("file"),
        options: &["--policy", "--app"],
        summary: "verify an offload definition for every app rule that may install it \
                  (no manager needed); exit 1 if any refuses it",
    },
    Cmd {
        object: "remote",
        name: "show",
        args: "[--offset N] [--limit N]",
        completes: None,
        options: LIST_OPTIONS,
        summary: "remote clients' sessions: offload, instance, address, how long held and idle, \
                  triggers",
    },
    Cmd {
        object: "remote",
        name: "kill",
        args: "HANDLE INSTANCE",
        completes: None,
        options: &[],
        summary: "end the remote client's session INSTANCE of offload HANDLE (it may say hello \
                  again)",
    },
    Cmd {
        object: "ban",
        name: "show",
        args: "[--offset N] [--limit N]",
        completes: None,
        options: LIST_OPTIONS,
        summary: "bans in force: app, uid or remote address, time left",
    },
    Cmd {
        object: "ban",
        name: "add",
        args: "APP ADDRESS DURATION",
        completes: None,
        options: &[],
        summary: "ban app APP's remote clients at ADDRESS for DURATION (\"1h\", \"infinity\"): \
                  their sessions end, their hellos are refused",
    },
    Cmd {
        object: "ban",
        name: "lift",
        args: "APP {ADDRESS | uid UID}",
        completes: None,
        options: &[],
        summary: "lift the ban on app APP's remote clients at ADDRESS, or on its installs by UID",
    },
    Cmd {
        object: "stat",
        name: "show",
        args: "[--offset N] [--limit N]",
        completes: None,
        options: LIST_OPTIONS,
        summary: "per installed offload: triggers served, WQEs run, errors",
    },
    Cmd {
        object: "region",
        name: "show",
        args: "[--offset N] [--limit N]",
        completes: None,
        options: LIST_OPTIONS,
        summary: "registered regions and pinned bytes, per client",
    },
    Cmd {
        object: "policy",
        name: "reload",
        args: "",
        completes: None,
        options: &[],
        summary: "load manager.toml, policy.toml and offloads.d/ again, as SIGHUP does \
                  (all or nothing: the old ones stay if one is broken)",
    },
    Cmd {
        object: "monitor",
        name: "follow",
        args: "",
        completes: None,
        options: &[],
        summary: "stream audit events and live counters until interrupted \
                  (-j: one JSON object per line)",
    },
    Cmd {
        object: "completion",
        name: "bash",
        args: "",
        completes: None,
        options: &[],
        summary: "print a bash completion script (also: zsh, fish)",
    },
    Cmd {
        object: "completion",
        name: "zsh",
        args: "",
        completes: None,
        options: &[],
        summary: "print a zsh completion script",
    },
    Cmd {
        object: "completion",
        name: "fish",
        args: "",
        completes: None,
        options: &[],
        summary: "print a fish completion script",
    },
];

/// The global options, as `help` shows them: (short, long, value, what).
pub const GLOBAL_OPTIONS: &[(&str, &str, &str, &str)] = &[
    ("-j", "--json", "", "print JSON: an array of flat objects"),
    ("-p", "--pretty", "", "indent the JSON"),
    ("-d", "--details", "", "show every field, not the usual few"),
    (
        "-s",
        "--socket",
        "PATH",
        "the admin socket (default: [admin] socket of the config, else /run/redn/admin.sock)",
    ),
    (
        "-c",
        "--config",
        "PATH",
        "manager.toml to find the admin socket in (default /etc/redn/manager.toml)",
    ),
    ("-h", "--help", "", "this text"),
    ("-V", "--version", "", "the version"),
];

/// The objects, in table order, without repeats.
pub fn objects() -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for c in COMMANDS {
        if !out.contains(&c.object) {
            out.push(c.object);
        }
    }
    out
}

/// The commands of `object`.
pub fn commands(object: &str) -> impl Iterator<Item = &'static Cmd> + '_ {
    COMMANDS.iter().filter(move |c| c.object == object)
}

/// The one word of `words` that `given` names: itself, or the only one it is a prefix of
/// (as `rdma` and `ip` take `redn cl sh`). An error says which were possible.
pub fn resolve<'w>(given: &str, words: &[&'w str], what: &str) -> Result<&'w str, String> {
    if let Some(w) = words.iter().find(|w| **w == given) {
        return Ok(w);
    }
    let matching: Vec<&&str> = words.iter().filter(|w| w.starts_with(given)).collect();
    match matching.as_slice() {
        [one] => Ok(one),
        [] => Err(format!(
            "unknown {what} {given:?} (one of: {})",
            words.join(", ")
        )),
        many => Err(format!(
            "{what} {given:?} is ambiguous: {}",
            many.iter().map(|w| **w).collect::<Vec<_>>().join(", ")
        )),
    }
}

/// The whole `help` text.
pub fn usage() -> String {
    let mut s = String::from(
        "Usage: redn [OPTIONS] OBJECT [COMMAND [ARGS]]\n       redn [OPTIONS] OBJECT help\n\n\
         Inspect and manage the RedN offload manager through its admin socket\n\
         (varlink interface io.redn.Admin). Objects and commands may be shortened to any\n\
         unique prefix: `redn cl sh` is `redn client show`.\n\nOptions:\n",
    );
    for (short, long, value, what) in GLOBAL_OPTIONS {
        let flag = if value.is_empty() {
            format!("{short}, {long}")
        } else {
            format!("{short}, {long} {value}")
        };
        s.push_str(&format!("  {flag:<22} {what}\n"));
    }
    s.push_str("\nObjects and commands (the first of each object is its default):\n");
    for object in objects() {
        s.push_str(&object_usage(object));
    }
    s.push_str(
        "\nThe show commands that take [--offset N] [--limit N] show every entry of the\n\
         manager's list, fetched a page at a time. Given --offset or --limit they show one\n\
         page instead: from entry N (counted from 0), at most N entries, and say on stderr\n\
         where the next page starts.\n",
    );
    s.push_str(
        "\nExit status: 0 on success, 1 when the command failed or the verifier refused,\n\
         2 for a usage error. Errors go to stderr as `Error: ...`, or with -j to stdout as\n\
         {\"error\": \"...\"}.\n",
    );
    s
}

/// `redn OBJECT help`.
pub fn object_usage(object: &str) -> String {
    let mut s = String::new();
    for c in commands(object) {
        let call = format!("redn {} {} {}", c.object, c.name, c.args);
        s.push_str(&format!("  {}\n      {}\n", call.trim_end(), c.summary));
    }
    s
}

/// A completion script for `shell` (bash, zsh or fish), made from [`COMMANDS`].
pub fn completion(shell: &str) -> Option<String> {
    let objects = objects();
    let long_options: Vec<&str> = GLOBAL_OPTIONS.iter().map(|o| o.1).collect();
    let per_object: Vec<(&str, Vec<&str>)> = objects
        .iter()
        .map(|o| (*o, commands(o).map(|c| c.name).collect()))
        .collect();
    let command_options: Vec<(&str, &str, &[&str])> = COMMANDS
        .iter()
        .filter(|c| !c.options.is_empty())
        .map(|c| (c.object, c.name, c.options))
        .collect();
    let file_commands: Vec<(&str, &str)> = COMMANDS
        .iter()
        .filter(|c| c.completes == Some("file"))
        .map(|c| (c.object, c.name))
        .collect();
    match shell {
        "bash" => {
            let mut s = String::from(
                "# bash completion for redn, generated by `redn completion bash`\n\
                 _redn() {\n    local cur words=() i\n    cur=\"${COMP_WORDS[COMP_CWORD]}\"\n\
                 \x20   for ((i = 1; i < COMP_CWORD; i++)); do\n\
                 \x20       case \"${COMP_WORDS[i]}\" in\n\
                 \x20           -s|--socket|-c|--config|--policy|--app|--offset|--limit) ((i++)) ;;\n\
                 \x20           -*) ;;\n\
                 \x20           *) words+=(\"${COMP_WORDS[i]}\") ;;\n\
                 \x20       esac\n    done\n",
            );
            s.push_str(&format!(
                "    if [[ $cur == -* ]]; then\n        local opts=\"{}\"\n        case \"${{words[0]}} ${{words[1]}}\" in\n",
                long_options.join(" ")
            ));
            for (object, name, options) in &command_options {
                s.push_str(&format!(
                    "            \"{object} {name}\") opts=\"$opts {}\" ;;\n",
                    options.join(" ")
                ));
            }
            s.push_str(
                "        esac\n        COMPREPLY=($(compgen -W \"$opts\" -- \"$cur\"))\n        return\n    fi\n",
            );
            s.push_str(&format!(
                "    case ${{#words[@]}} in\n        0) COMPREPLY=($(compgen -W \"{}\" -- \"$cur\")) ;;\n        1) case ${{words[0]}} in\n",
                objects.join(" ")
            ));
            for (object, cmds) in &per_object {
                s.push_str(&format!(
                    "            {object}) COMPREPLY=($(compgen -W \"{} help\" -- \"$cur\")) ;;\n",
                    cmds.join(" ")
                ));
            }
            s.push_str("        esac ;;\n        *) case \"${words[0]} ${words[1]}\" in\n");
            for (object, name) in &file_commands {
                s.push_str(&format!(
                    "            \"{object} {name}\") COMPREPLY=($(compgen -f -- \"$cur\")) ;;\n"
                ));
            }
            s.push_str("        esac ;;\n    esac\n}\ncomplete -F _redn redn\n");
            Some(s)
        }
        "zsh" => {
            let mut s = String::from(
                "#compdef redn\n# zsh completion for redn, generated by `redn completion zsh`\n\
                 _redn() {\n    local -a args\n    args=(${words[2,CURRENT-1]:#-*})\n\
                 \x20   case $#args in\n",
            );
            s.push_str(&format!(
                "        0) if [[ $PREFIX == -* ]]; then compadd -- {}; else compadd -- {}; fi ;;\n        1) case $args[1] in\n",
                long_options.join(" "),
                objects.join(" ")
            ));
            for (object, cmds) in &per_object {
                s.push_str(&format!(
                    "            {object}) compadd -- {} help ;;\n",
                    cmds.join(" ")
                ));
            }
            s.push_str("        esac ;;\n        *) case \"$args[1] $args[2]\" in\n");
            for (object, name) in &file_commands {
                let options = command_options
                    .iter()
                    .find(|(o, n, _)| o == object && n == name)
                    .map_or(String::new(), |(_, _, opts)| opts.join(" "));
                s.push_str(&format!(
                    "            \"{object} {name}\") compadd -- {options}; _files ;;\n"
                ));
            }
            s.push_str("        esac ;;\n    esac\n}\ncompdef _redn redn\n");
            Some(s)
        }
        "fish" => {
            let mut s = String::from(
                "# fish completion for redn, generated by `redn completion fish`\n\
                 complete -c redn -f\n",
            );
            for (short, long, value, what) in GLOBAL_OPTIONS {
                let takes = if value.is_empty() { "" } else { " -r" };
                s.push_str(&format!(
                    "complete -c redn -s {} -l {}{takes} -d '{}'\n",
                    &short[1..],
                    &long[2..],
                    what.replace('\'', "")
                ));
            }
            s.push_str(&format!(
                "complete -c redn -n '__fish_use_subcommand' -a '{}'\n",
                objects.join(" ")
            ));
            for (object, cmds) in &per_object {
                s.push_str(&format!(
                    "complete -c redn -n '__fish_seen_subcommand_from {object}; and not __fish_seen_subcommand_from {} help' -a '{} help'\n",
                    cmds.join(" "),
                    cmds.join(" ")
                ));
            }
            for (object, name) in &file_commands {
                s.push_str(&format!(
                    "complete -c redn -n '__fish_seen_subcommand_from {object}; and __fish_seen_subcommand_from {name}' -F\n"
                ));
            }
            for (object, name, options) in &command_options {
                for option in *options {
                    s.push_str(&format!(
                        "complete -c redn -n '__fish_seen_subcommand_from {object}; and __fish_seen_subcommand_from {name}' -l {} -r\n",
                        &option[2..]
                    ));
                }
            }
            Some(s)
        }
        _ => None,
    }
}

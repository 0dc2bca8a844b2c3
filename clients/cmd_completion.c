/*
 * clients/cmd_completion.c - vspec completion bash|zsh: a shell completion script, written
 * from one table of the commands and their options (tests/test_cli_completion.c checks it
 * against every command's --help, so a new option that is not here fails a test).
 *
 * Acceptance rules and schedulers are completed with the names a daemon has loaded, asked
 * at completion time (`vspec plugins list`, with the --server/--admin of the line being
 * completed and a 1 s timeout), else with the names of the plugins vspec ships.
 */
#include "clients/cli.h"

/* An option and what its value is: NULL a flag; "" a value of no known set; "@file",
 * "@dir" a path; "@accept", "@sched" a plugin's name; "@method" a method; else the words it
 * takes. */
typedef struct vs__copt {
  const char *name, *value;
} vs__copt;

typedef struct vs__ccmd {
  const char *name;
  const char *args; /* positional words ("@file": a path), or "" */
  const vs__copt *opts;
  int net; /* takes the network options */
} vs__ccmd;

static const vs__copt vs__net_copts[] = {{"--server", ""}, {"--admin", ""},
                                         {"--curve-server-key", "@file"},
                                         {"--curve-key", "@file"}, {"--timeout", ""}, {0, 0}};

static const vs__copt vs__gen_copts[] = {
    {"--class", ""}, {"--prompt", ""}, {"--seed", ""}, {"--model", ""}, {"--method", "@method"},
    {"--accept", "@accept"}, {"--param", ""}, {"--sched", "@sched"}, {"--sched-param", ""},
    {"--draft", "auto model head jacobi"}, {"--temperature", ""}, {"--top-k", ""}, {"--top-p", ""},
    {"--cfg", ""}, {"--cfg-interval", ""}, {"--num-iter", ""},
    {"--cfg-schedule", "linear constant"}, {"--out", "@file"}, {"--upscale", ""},
    {"--previews", "@dir"}, {"--preview-kind", "lut decode"}, {"--preview-every", ""},
    {"--deadline", ""}, {"--priority", ""}, {"--tag", ""}, {"--job-id", ""}, {"--json", NULL},
    {"--quiet", NULL}, {0, 0}};
static const vs__copt vs__json_copts[] = {{"--json", NULL}, {0, 0}};
static const vs__copt vs__cancel_copts[] = {{"--last", NULL}, {0, 0}};
static const vs__copt vs__ping_copts[] = {{"--via-admin", NULL}, {0, 0}};
static const vs__copt vs__keygen_copts[] = {{"--force", NULL}, {0, 0}};
static const vs__copt vs__none[] = {{0, 0}};

static const vs__ccmd vs__ccmds[] = {
    {"generate", "", vs__gen_copts, 1},   {"status", "", vs__json_copts, 1},
    {"plugins", "list reload", vs__json_copts, 1}, {"cancel", "", vs__cancel_copts, 1},
    {"ping", "", vs__ping_copts, 1},      {"keygen", "@file", vs__keygen_copts, 0},
    {"version", "", vs__none, 0},         {"completion", "bash zsh", vs__none, 0},
};
#define VS_N_CCMDS (sizeof vs__ccmds / sizeof vs__ccmds[0])

/* The plugin names vspec ships, for when no daemon answers. */
#define VS_BUILTIN_RULES "exact lantern lanternpp coolsd uniform_rsd gsd continuous"
#define VS_BUILTIN_SCHEDS "standard vvs"

static void cc_words(FILE *f, const vs__copt *o) {
  for (; o->name; o++) fprintf(f, " %s", o->name);
}

/* ---- bash ----------------------------------------------------------------------------- */

static const char vs__bash_head[] =
    "# bash completion for vspec, written by `vspec completion bash`\n"
    "# (installed as $DATADIR/bash-completion/completions/vspec, or: source <(vspec completion bash))\n"
    "\n"
    "# The loaded names of kind $1 (accept|sched) from a daemon, else the shipped ones.\n"
    "_vspec_plugins() {\n"
    "  local names i\n"
    "  local -a net=()\n"
    "  for ((i = 1; i + 1 < ${#_vspec_words[@]}; i++)); do\n"
    "    case ${_vspec_words[i]} in\n"
    "      --server|--admin|--curve-server-key|--curve-key)\n"
    "        net+=(\"${_vspec_words[i]}\" \"${_vspec_words[i+1]}\") ;;\n"
    "    esac\n"
    "  done\n"
    "  names=$(\"${_vspec_words[0]}\" plugins list --timeout 1 \"${net[@]}\" 2>/dev/null |\n"
    "          awk -v k=\"$1\" '$1 == k { print $2 }')\n"
    "  if [[ -z $names ]]; then\n"
    "    case $1 in\n"
    "      accept) names=\"" VS_BUILTIN_RULES "\" ;;\n"
    "      sched) names=\"" VS_BUILTIN_SCHEDS "\" ;;\n"
    "    esac\n"
    "  fi\n"
    "  echo $names\n"
    "}\n"
    "\n"
    "# Methods: ar | sd:RULE[@SCHED]; after an @, the schedulers.\n"
    "_vspec_methods() {\n"
    "  local w out=ar\n"
    "  if [[ $1 == *@* ]]; then\n"
    "    for w in $(_vspec_plugins sched); do out+=\" ${1%%@*}@$w\"; done\n"
    "  else\n"
    "    for w in $(_vspec_plugins accept); do out+=\" sd:$w\"; done\n"
    "  fi\n"
    "  echo $out\n"
    "}\n"
    "\n"
    "# bash splits words at the colons of COMP_WORDBREAKS; replies are for what follows the\n"
    "# last colon of the word then (what bash-completion's __ltrim_colon_completions does).\n"
    "_vspec_colon() {\n"
    "  if [[ $1 == *:* && $COMP_WORDBREAKS == *:* ]]; then\n"
    "    local pre=${1%\"${1##*:}\"} i\n"
    "    for i in \"${!COMPREPLY[@]}\"; do COMPREPLY[i]=${COMPREPLY[i]#\"$pre\"}; done\n"
    "  fi\n"
    "}\n"
    "\n";

/* _vspec_value OPTION CUR: the replies for an option's value; 1 if it takes none. */
static void cc_bash_values(FILE *f) {
  fprintf(f, "_vspec_value() {\n  case $1 in\n");
  const char *kinds[][2] = {{"@file", "compopt -o filenames 2>/dev/null; "
                                      "COMPREPLY=($(compgen -f -- \"$2\"))"},
                            {"@dir", "compopt -o filenames 2>/dev/null; "
                                     "COMPREPLY=($(compgen -d -- \"$2\"))"},
                            {"@accept", "COMPREPLY=($(compgen -W \"$(_vspec_plugins accept)\" "
                                        "-- \"$2\"))"},
                            {"@sched", "COMPREPLY=($(compgen -W \"$(_vspec_plugins sched)\" "
                                       "-- \"$2\"))"},
                            {"@method", "COMPREPLY=($(compgen -W \"$(_vspec_methods \"$2\")\" "
                                        "-- \"$2\"))"},
                            {"", "COMPREPLY=()"}};
  const vs__copt *lists[] = {vs__gen_copts, vs__net_copts};
  for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
    int n = 0;
    for (size_t l = 0; l < 2; l++)
      for (const vs__copt *o = lists[l]; o->name; o++)
        if (o->value && !strcmp(o->value, kinds[k][0]))
          fprintf(f, "%s%s", n++ ? "|" : "    ", o->name);
    if (n) fprintf(f, ") %s ;;\n", kinds[k][1]);
  }
  /* options that take one of a few words */
  for (const vs__copt *o = vs__gen_copts; o->name; o++)
    if (o->value && *o->value && *o->value != '@')
      fprintf(f, "    %s) COMPREPLY=($(compgen -W \"%s\" -- \"$2\")) ;;\n", o->name, o->value);
  fprintf(f, "    *) return 1 ;;\n  esac\n}\n\n");
}

static void cc_bash_commands(FILE *f) {
  fprintf(f, "_vspec_options() {\n  case $1 in\n");
  for (size_t i = 0; i < VS_N_CCMDS; i++) {
    fprintf(f, "    %s) echo \"--help", vs__ccmds[i].name);
    cc_words(f, vs__ccmds[i].opts);
    if (vs__ccmds[i].net) cc_words(f, vs__net_copts);
    fprintf(f, "\" ;;\n");
  }
  fprintf(f, "  esac\n}\n\n_vspec_args() {\n  case $1 in\n");
  for (size_t i = 0; i < VS_N_CCMDS; i++)
    if (*vs__ccmds[i].args && *vs__ccmds[i].args != '@')
      fprintf(f, "    %s) echo \"%s\" ;;\n", vs__ccmds[i].name, vs__ccmds[i].args);
  fprintf(f, "  esac\n}\n\n");
}

static const char vs__bash_main[] =
    "_vspec() {\n"
    "  # the words up to the cursor, split at blanks only (not at COMP_WORDBREAKS)\n"
    "  local line=${COMP_LINE:0:COMP_POINT} cur prev cmd n\n"
    "  local -a _vspec_words\n"
    "  read -ra _vspec_words <<<\"$line\"\n"
    "  [[ -z $line || $line == *[[:space:]] ]] && _vspec_words+=(\"\")\n"
    "  n=${#_vspec_words[@]}\n"
    "  cur=${_vspec_words[n-1]}\n"
    "  COMPREPLY=()\n"
    "  if ((n <= 2)); then\n"
    "    COMPREPLY=($(compgen -W \"%s --help --version\" -- \"$cur\"))\n"
    "    return\n"
    "  fi\n"
    "  cmd=${_vspec_words[1]} prev=${_vspec_words[n-2]}\n"
    "  if _vspec_value \"$prev\" \"$cur\"; then\n"
    "    _vspec_colon \"$cur\"\n"
    "    return\n"
    "  fi\n"
    "  if [[ $cur == -* ]]; then\n"
    "    COMPREPLY=($(compgen -W \"$(_vspec_options \"$cmd\")\" -- \"$cur\"))\n"
    "  elif [[ $cmd == keygen ]]; then\n"
    "    compopt -o filenames 2>/dev/null\n"
    "    COMPREPLY=($(compgen -f -- \"$cur\"))\n"
    "  elif ((n == 3)); then\n"
    "    COMPREPLY=($(compgen -W \"$(_vspec_args \"$cmd\")\" -- \"$cur\"))\n"
    "  fi\n"
    "}\n"
    "complete -F _vspec vspec\n";

static void cc_print_bash(FILE *f) {
  fputs(vs__bash_head, f);
  cc_bash_values(f);
  cc_bash_commands(f);
  char names[512] = "";
  for (size_t i = 0; i < VS_N_CCMDS; i++)
    snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? " " : "",
             vs__ccmds[i].name);
  fprintf(f, vs__bash_main, names);
}

/* ---- zsh ------------------------------------------------------------------------------ */

static const char vs__zsh_head[] =
    "#compdef vspec\n"
    "# zsh completion for vspec, written by `vspec completion zsh`: installed as\n"
    "# $DATADIR/zsh/site-functions/_vspec, or save it as _vspec in a directory of $fpath\n"
    "\n"
    "# The loaded names of kind $1 (accept|sched) from a daemon, else the shipped ones.\n"
    "_vspec_plugins() {\n"
    "  local -a net names\n"
    "  local i\n"
    "  for ((i = 2; i < $#words; i++)); do\n"
    "    case $words[i] in\n"
    "      --server|--admin|--curve-server-key|--curve-key) net+=($words[i] $words[i+1]) ;;\n"
    "    esac\n"
    "  done\n"
    "  names=(${(f)\"$($words[1] plugins list --timeout 1 $net 2>/dev/null |\n"
    "                 awk -v k=$1 '$1 == k { print $2 }')\"})\n"
    "  if (( ! $#names )); then\n"
    "    case $1 in\n"
    "      accept) names=(" VS_BUILTIN_RULES ") ;;\n"
    "      sched) names=(" VS_BUILTIN_SCHEDS ") ;;\n"
    "    esac\n"
    "  fi\n"
    "  print -r -- $names\n"
    "}\n"
    "_vspec_accept() { compadd -- ${=$(_vspec_plugins accept)} }\n"
    "_vspec_sched() { compadd -- ${=$(_vspec_plugins sched)} }\n"
    "_vspec_method() {\n"
    "  local w\n"
    "  local -a out\n"
    "  if [[ $PREFIX == *@* ]]; then\n"
    "    for w in ${=$(_vspec_plugins sched)}; do out+=(\"${PREFIX%%@*}@$w\"); done\n"
    "  else\n"
    "    out=(ar)\n"
    "    for w in ${=$(_vspec_plugins accept)}; do out+=(\"sd:$w\"); done\n"
    "  fi\n"
    "  compadd -- $out\n"
    "}\n"
    "\n";

static const char *cc_zsh_action(const char *value) {
  if (!strcmp(value, "@file")) return "_files";
  if (!strcmp(value, "@dir")) return "_files -/";
  if (!strcmp(value, "@accept")) return "_vspec_accept";
  if (!strcmp(value, "@sched")) return "_vspec_sched";
  if (!strcmp(value, "@method")) return "_vspec_method";
  return "";
}

static void cc_zsh_opts(FILE *f, const vs__copt *o) {
  for (; o->name; o++) {
    if (!o->value) fprintf(f, " \\\n        '%s'", o->name);
    else if (*o->value && *o->value != '@')
      fprintf(f, " \\\n        '%s:%s:(%s)'", o->name, o->name + 2, o->value);
    else fprintf(f, " \\\n        '%s:%s:%s'", o->name, o->name + 2, cc_zsh_action(o->value));
  }
}

static void cc_print_zsh(FILE *f) {
  fputs(vs__zsh_head, f);
  fprintf(f, "_vspec() {\n  if (( CURRENT == 2 )); then\n    compadd -- --help --version");
  for (size_t i = 0; i < VS_N_CCMDS; i++) fprintf(f, " %s", vs__ccmds[i].name);
  fprintf(f, "\n    return\n  fi\n  local cmd=$words[2]\n  shift words\n  (( CURRENT-- ))\n"
          "  case $cmd in\n");
  for (size_t i = 0; i < VS_N_CCMDS; i++) {
    const vs__ccmd *c = &vs__ccmds[i];
    fprintf(f, "    %s)\n      _arguments '--help'", c->name);
    cc_zsh_opts(f, c->opts);
    if (c->net) cc_zsh_opts(f, vs__net_copts);
    if (!strcmp(c->args, "@file")) fprintf(f, " \\\n        '1:file:_files'");
    else if (*c->args) fprintf(f, " \\\n        '1:%s:(%s)'", c->name, c->args);
    fprintf(f, " ;;\n");
  }
  fprintf(f, "  esac\n}\n\n_vspec \"$@\"\n");
}

int vs_cmd_completion(int argc, char **argv) {
  const char *shell = argc == 2 ? argv[1] : NULL;
  if (shell && (!strcmp(shell, "--help") || !strcmp(shell, "-h"))) {
    printf("usage: vspec completion bash|zsh\n\n"
           "Prints a completion script for the shell: commands, options, and the acceptance\n"
           "rules and schedulers a daemon has loaded (else the shipped ones). `make install`\n"
           "installs both; by hand: source <(vspec completion bash) in ~/.bashrc, or save the\n"
           "zsh one as _vspec in a directory of $fpath.\n");
    return EXIT_OK;
  }
  if (shell && !strcmp(shell, "bash")) cc_print_bash(stdout);
  else if (shell && !strcmp(shell, "zsh")) cc_print_zsh(stdout);
  else {
    fprintf(stderr, "vspec completion: give the shell: bash or zsh (see vspec completion "
            "--help)\n");
    return EXIT_USAGE;
  }
  return fflush(stdout) == 0 ? EXIT_OK : EXIT_FAIL;
}

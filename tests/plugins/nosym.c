/* A shared object that is not a vspec plugin: it lacks vspec_plugin_entry. */
int vspec_not_a_plugin(void);
int vspec_not_a_plugin(void) { return 42; }

/* A host program built against the installed library through pkg-config. */
#include <stdio.h>

#include <ddplug/ddplug.h>

int main(void) {
  if (DDPLUG_VERSION_MAJOR_OF(ddplug_abi_version()) != DDPLUG_ABI_MAJOR) return 1;
  ddplug_plugin_info info = DDPLUG_PLUGIN_INFO_INIT;
  if (ddplug_plugin_inspect("example", &info) != DDPLUG_OK) {
    fprintf(stderr, "%s\n", ddplug_last_error());
    return 1;
  }
  printf("consumer: libddplug %s found plugin %s at %s\n", ddplug_version_string(), info.name,
         info.path);
  return 0;
}

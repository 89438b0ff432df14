// main.cc: dyad-demo, the program behind `dyad demo` (see demo.h).
#include "demo.h"

int main(int argc, char** argv) { return dyad::RunDemo(argc, argv); }

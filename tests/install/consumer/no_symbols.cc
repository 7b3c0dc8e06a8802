// Calls nothing from libcohort_torch: linked with --as-needed, the program must still need the
// library, whose static initializers register torchrun's c10d store connector (issue 12 review).
int main() { return 0; }

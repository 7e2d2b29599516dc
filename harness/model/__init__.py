"""What is computed: token trees and their formats, cases and suites, paged inputs, the
float64 reference, the comparison with its tolerances, and the FLOP/byte work model.
Imports nothing above treebench.harness.errors."""

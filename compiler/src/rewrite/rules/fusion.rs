//! Fusion: batch norm folded into the preceding convolution, bias and
//! activation computed in the convolution's stage — and the fusions read
//! backwards, so that a convolution that arrives fused can still take a
//! form (im2col) that has no fused variant.

use super::super::lang::{Node, Shapes};
use egg::{rewrite as rw, Rewrite};

pub fn rules() -> Vec<Rewrite<Node, Shapes>> {
    vec![
        // Batch-norm folding into the preceding convolution:
        //   γ·(conv(X, W) − μ)/√(σ²+ε) + β  =  conv(X, W·s) + (β − μ·s),  s = γ/√(σ²+ε)
        rw!("bn-fold";
            "(batch_norm (conv2d ?x ?w ?p ?s ?d ?g) ?ga ?be ?m ?v ?eps)" =>
            "(conv2d_bias ?x (bn_fold_weight ?w ?ga ?v ?eps) (bn_fold_bias ?be ?m ?ga ?v ?eps) ?p ?s ?d ?g)"),
        // Bias fusion: conv(X, W) + b[k] computed in the convolution's stage.
        rw!("conv-bias-fuse";
            "(bias_add (conv2d ?x ?w ?p ?s ?d ?g) ?b)" => "(conv2d_bias ?x ?w ?b ?p ?s ?d ?g)"),
        // Activation fusion: relu(conv(X, W) + b) in one stage.
        rw!("conv-bias-relu-fuse";
            "(relu (conv2d_bias ?x ?w ?b ?p ?s ?d ?g))" => "(conv2d_bias_relu ?x ?w ?b ?p ?s ?d ?g)"),
        // The fusions read backwards: a convolution that arrives fused (an
        // exporter folded batch norm into a Conv with bias) is also its parts,
        // so it can still take the im2col form, which has no fused variant.
        rw!("conv-bias-unfuse";
            "(conv2d_bias ?x ?w ?b ?p ?s ?d ?g)" => "(bias_add (conv2d ?x ?w ?p ?s ?d ?g) ?b)"),
        rw!("conv-bias-relu-unfuse";
            "(conv2d_bias_relu ?x ?w ?b ?p ?s ?d ?g)" => "(relu (conv2d_bias ?x ?w ?b ?p ?s ?d ?g))"),
    ]
}

#[cfg(test)]
mod tests {
    use super::super::testing::runner;
    use super::rules;

    egg::test_fn! { bn_fold, rules(), runner = runner(&[], &[]),
    "(batch_norm (conv2d x w 1 1 1 1) ga be m v 0)"
    => "(conv2d_bias x (bn_fold_weight w ga v 0) (bn_fold_bias be m ga v 0) 1 1 1 1)" }

    egg::test_fn! { conv_bias_fuse, rules(), runner = runner(&[], &[]),
    "(bias_add (conv2d x w 0 2 1 1) b)" => "(conv2d_bias x w b 0 2 1 1)" }

    egg::test_fn! { conv_bias_relu_fuse, rules(), runner = runner(&[], &[]),
    "(relu (bias_add (conv2d x w 0 1 1 1) b))" => "(conv2d_bias_relu x w b 0 1 1 1)" }

    egg::test_fn! { conv_bias_unfuse, rules(), runner = runner(&[], &[]),
    "(conv2d_bias x w b 1 1 1 1)" => "(bias_add (conv2d x w 1 1 1 1) b)" }

    egg::test_fn! { conv_bias_relu_unfuse, rules(), runner = runner(&[], &[]),
    "(conv2d_bias_relu x w b 1 1 1 1)" => "(relu (bias_add (conv2d x w 1 1 1 1) b))" }
}

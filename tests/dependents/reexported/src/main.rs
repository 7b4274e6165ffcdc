wrapper::limited_handler!(two_a_user, capacity = 2, cost = 1u32 + 0);

#[tokio::main(flavor = "current_thread")]
async fn main() {
    for _ in 0..2 {
        assert_eq!(two_a_user(7).await.expect("admitted"), 7);
    }
    let denied = two_a_user(7).await.expect_err("the third is denied");
    assert_eq!(denied.key, "handler:7");
    println!("through a re-exporting library: {denied}");
}
